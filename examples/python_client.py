#!/usr/bin/env python3
"""A podlock client in plain Python (standard library only).

    with PodLock("report") as token:   # waits FIFO, heartbeats, releases on exit
        store.write(data, token)       # pass the fencing token with every write

PODLOCK_ADDR: the sidecar (default http://127.0.0.1:4040); STORE_URL: a fenced resource.
"""
import json
import os
import threading
import urllib.error
import urllib.request

ADDR = os.environ.get("PODLOCK_ADDR", "http://127.0.0.1:4040")


class LockError(Exception):
    """The sidecar refused: `code` is its error code (lock_held, lock_not_found, ...)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


def call(path, body):
    req = urllib.request.Request(ADDR + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        err = json.load(e)
        raise LockError(err["error"], err["message"]) from None


class PodLock:
    """Holds lock `name` for the `with` block; the block gets the fencing token."""

    def __init__(self, name, holder_id=None, wait_seconds=30, heartbeat_timeout_seconds=None):
        self.name, self.wait = name, wait_seconds
        self.body = {"holderId": holder_id or f"py-{os.getpid()}"}
        if heartbeat_timeout_seconds:
            self.body["heartbeatTimeoutSeconds"] = heartbeat_timeout_seconds
        self._stop = threading.Event()

    def __enter__(self):
        options = {**self.body, "waitSeconds": self.wait}
        if os.environ.get("PODLOCK_CONTAINER"):
            # Set by the injector: the hold then ends when this container restarts, and not
            # when another container of the pod does.
            options["container"] = os.environ["PODLOCK_CONTAINER"]
        grant = call(f"/v1/locks/{self.name}/acquire", options)
        window = grant.get("heartbeatTimeoutSeconds") or 0
        if window:
            threading.Thread(target=self._beat, args=(window / 3,), daemon=True).start()
        return grant["fencingToken"]

    def _beat(self, period):
        while not self._stop.wait(period):
            call(f"/v1/locks/{self.name}/heartbeat", {"holderId": self.body["holderId"]})

    def __exit__(self, *exc):
        self._stop.set()
        call(f"/v1/locks/{self.name}/release", {"holderId": self.body["holderId"]})


if __name__ == "__main__":
    store = os.environ.get("STORE_URL", "http://127.0.0.1:8000")
    with PodLock("report", holder_id="python-example", heartbeat_timeout_seconds=5) as token:
        print(f"acquired report with fencing token {token}")
        urllib.request.urlopen(urllib.request.Request(
            f"{store}/increment?token={token}&writer=python-example", method="POST")).read()
        print(f"wrote with token {token}")
    print("released")
    try:
        with PodLock("no-such-lock-declared", wait_seconds=0):
            pass
    except LockError as e:
        print(f"as expected: {e.code}")
