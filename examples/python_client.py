#!/usr/bin/env python3
"""A podlock client in plain Python (standard library only) that stops its work when it loses
the lock.

    with PodLock("report", heartbeat_timeout_seconds=5) as lock:
        while more_work() and not lock.lost.is_set():
            store.write(data, lock.token)      # pass the fencing token with every write
    if lock.lost.is_set():                     # the work stopped early; lock.reason says why

PodLock acquires (waiting in the FIFO queue), heartbeats from a thread, follows the sidecar's
event stream and releases on exit. `lock.lost` is set when the hold ends by anything but this
release: a `lost` event (lease expired or revoked, key or lock deleted, the sidecar stopping),
a heartbeat refused or unanswered, or the event stream ending (the sidecar died or hangs).

PODLOCK_ADDR: the sidecar (default http://127.0.0.1:4040); LOCK: the lock (report); STORE_URL:
a fenced resource such as examples/fenced_store.py (http://127.0.0.1:8000); WORK_ITEMS: writes
to make (10). Exit status: 0 done and released, 1 not acquired, 75 the lock was lost.
"""
import json
import os
import sys
import threading
import urllib.error
import urllib.request

ADDR = os.environ.get("PODLOCK_ADDR", "http://127.0.0.1:4040")
ANSWER_WITHIN = 2  # seconds: the sidecar is on loopback; no answer by then means it hangs
EVENTS_SILENT = 20  # seconds: the event stream sends a keep-alive line every 15 s


class LockError(Exception):
    """The sidecar refused: `code` is its error code (lock_held, lock_not_found, ...)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


def call(path, body, timeout=ANSWER_WITHIN):
    req = urllib.request.Request(ADDR + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        err = json.load(e)
        raise LockError(err["error"], err["message"]) from None


class PodLock:
    """Holds lock `name` for the `with` block: `token` is the fencing token, `lost` an Event set
    when the hold ends early, `reason` why."""

    def __init__(self, name, holder_id=None, wait_seconds=30, heartbeat_timeout_seconds=None):
        self.name, self.holder = name, holder_id or f"py-{os.getpid()}"
        self.options = {"holderId": self.holder, "waitSeconds": wait_seconds}
        if heartbeat_timeout_seconds:
            self.options["heartbeatTimeoutSeconds"] = heartbeat_timeout_seconds
        if os.environ.get("PODLOCK_CONTAINER"):
            # Set by the injector: the hold then ends when this container restarts, and not
            # when another container of the pod does.
            self.options["container"] = os.environ["PODLOCK_CONTAINER"]
        self.token, self.reason = None, None
        self.lost, self._closing = threading.Event(), threading.Event()

    def __enter__(self):
        return self if self.token is not None else self.acquire()

    def acquire(self):
        """Waits for the lock; returns self, or raises LockError (or OSError: no sidecar)."""
        # Follow the events before acquiring, so that a loss right after the grant is seen.
        events = urllib.request.urlopen(f"{ADDR}/v1/locks/{self.name}/events", timeout=EVENTS_SILENT)
        try:
            # The sidecar answers when the lock is granted, up to waitSeconds later: a shorter
            # timeout would give up (and so lose the place in the queue) while still waiting.
            wait = self.options["waitSeconds"] + ANSWER_WITHIN
            grant = call(f"/v1/locks/{self.name}/acquire", self.options, timeout=wait)
        except BaseException:
            events.close()
            raise
        self.token = grant["fencingToken"]
        threading.Thread(target=self._watch, args=(events,), daemon=True).start()
        if grant["heartbeatTimeoutSeconds"]:
            period = grant["heartbeatTimeoutSeconds"] / 3
            threading.Thread(target=self._beat, args=(period,), daemon=True).start()
        return self

    def lose(self, reason):
        """Marks the hold lost (the first reason given is kept)."""
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()

    def _watch(self, events):
        with events:
            reason = self._ending(events)
        if not self._closing.is_set():
            self.lose(reason)

    def _ending(self, events):
        """Why the hold ended, from the event stream: its `lost` event, or the stream's end."""
        kind = None
        try:
            for line in events:
                field, _, value = line.decode().partition(":")
                if field == "event":
                    kind = value.strip()
                elif field == "data" and kind in ("lost", "released"):
                    ev = json.loads(value)
                    if (ev["holderId"], ev["fencingToken"]) == (self.holder, self.token):
                        return ev.get("reason") or kind
        except OSError:  # reset, or silent for EVENTS_SILENT seconds
            pass
        return "the sidecar's event stream ended (the sidecar stopped or hangs)"

    def _beat(self, period):
        while not self._closing.wait(period):
            try:
                call(f"/v1/locks/{self.name}/heartbeat", {"holderId": self.holder})
            except Exception as e:  # 410 lock_lost, or no sidecar to answer: stop the work
                return self.lose(f"heartbeat failed: {e}")

    def __exit__(self, *exc):
        self._closing.set()
        if self.lost.is_set():
            return  # nothing left to release
        try:
            call(f"/v1/locks/{self.name}/release", {"holderId": self.holder})
        except Exception as e:  # 410 lock_lost: it ended before this release
            self.lose(f"release failed: {e}")


def write(store, token):
    """One piece of work: the store refuses it (409) once a newer holder has written."""
    url = f"{store}/increment?token={token}&writer=python-example"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=ANSWER_WITHIN).read()
        return True
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise
        return False


def main():
    name = os.environ.get("LOCK", "report")
    store = os.environ.get("STORE_URL", "http://127.0.0.1:8000")
    items = int(os.environ.get("WORK_ITEMS", "10"))
    try:
        lock = PodLock(name, heartbeat_timeout_seconds=5).acquire()
    except (LockError, OSError) as e:
        sys.exit(f"could not acquire {name}: {e}")
    with lock:  # released at the end of the block
        print(f"acquired {name} with fencing token {lock.token}", flush=True)
        done = 0
        while done < items and not lock.lost.is_set():
            if write(store, lock.token):
                done += 1
            else:
                lock.lose(f"the store refused token {lock.token}: a newer holder wrote")
            lock.lost.wait(0.1)  # the pace of the work; wakes at once on a loss
    if lock.lost.is_set():
        print(f"lost {name}: {lock.reason}; stopped after {done} writes", file=sys.stderr)
        sys.exit(75)
    print("released")


if __name__ == "__main__":
    main()
