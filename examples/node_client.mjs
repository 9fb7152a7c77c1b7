#!/usr/bin/env node
// A podlock client in Node 18+ (built-in fetch, no packages) that holds a lock while its work
// lasts and stops the work when it loses the lock.
//
// The hold is bound to its HTTP connection (POST /v1/locks/{name}/hold): no heartbeat to send,
// and closing the connection, or the process dying, releases it at once. The stream tells the
// hold's end: a `lost` event (lease expired or revoked, key or lock deleted, the sidecar
// stopping), or the stream ending or going silent (the sidecar died, hangs or is unreachable).
//
// PODLOCK_ADDR: the sidecar (default http://127.0.0.1:4040); LOCK: the lock (report);
// STORE_URL: a fenced resource such as examples/fenced_store.py (http://127.0.0.1:8000);
// WORK_ITEMS: writes to make (10). Exit status: 0 done and released, 1 not acquired, 75 the
// lock was lost.

const addr = process.env.PODLOCK_ADDR || "http://127.0.0.1:4040";
const lock = process.env.LOCK || "report";
const store = process.env.STORE_URL || "http://127.0.0.1:8000";
const items = Number(process.env.WORK_ITEMS || 10);
const KEEP_ALIVE_MS = 1000; // how often the sidecar sends a keep-alive line; 3 missed: it hangs
// How long the hold may wait in the queue: the sidecar answers once it is granted, so the answer
// may take that long, and ANSWER_WITHIN_MS more (no answer by then means the sidecar hangs). A
// shorter limit would give up, and lose the place in the queue, while still waiting.
const WAIT_SECONDS = 30;
const ANSWER_WITHIN_MS = 2000;

// Takes the lock: its fencing token, a promise of why the hold ended, and release(), which
// closes the connection and so releases the hold.
async function hold(name) {
  const options = { waitSeconds: WAIT_SECONDS, keepAliveSeconds: KEEP_ALIVE_MS / 1000 };
  if (process.env.PODLOCK_CONTAINER) {
    // Set by the injector: the hold then ends when this container restarts, and not when
    // another container of the pod does.
    options.container = process.env.PODLOCK_CONTAINER;
  }
  const connection = new AbortController();
  const unanswered = setTimeout(
    () => connection.abort(new Error(`no answer within ${WAIT_SECONDS} s + ${ANSWER_WITHIN_MS} ms`)),
    WAIT_SECONDS * 1000 + ANSWER_WITHIN_MS,
  );
  let resp;
  try {
    resp = await fetch(`${addr}/v1/locks/${name}/hold`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(options),
      signal: connection.signal,
    });
  } finally {
    clearTimeout(unanswered); // answered: the stream's silence limit takes over
  }
  if (!resp.ok) {
    const e = await resp.json();
    throw new Error(`${e.error}: ${e.message}`);
  }
  const events = serverSentEvents(resp.body, connection);
  const first = (await events.next()).value;
  if (first?.event !== "acquired") throw new Error("the hold's stream began without a grant");
  const ended = (async () => {
    try {
      for await (const { event, data } of events) {
        // `lost`, or `released` by a request of the same holder: the hold's last event.
        return `${event}: ${JSON.parse(data).reason ?? ""}`;
      }
      return "the hold's stream ended (the sidecar stopped)";
    } catch (e) {
      return `the hold's stream broke (the sidecar died, hangs or is unreachable): ${e.message}`;
    }
  })();
  return { token: JSON.parse(first.data).fencingToken, ended, release: () => connection.abort() };
}

// The events of a text/event-stream body, {event, data} each, without the keep-alive lines.
// Closes the connection when it has been silent for three keep-alive periods.
async function* serverSentEvents(body, connection) {
  const silent = setTimeout(() => connection.abort(), 3 * KEEP_ALIVE_MS);
  const decoder = new TextDecoder();
  let buffered = "", event = "", data = "";
  try {
    for await (const chunk of body) {
      silent.refresh();
      buffered += decoder.decode(chunk, { stream: true });
      const lines = buffered.split("\n");
      buffered = lines.pop(); // an incomplete line waits for the next chunk
      for (const line of lines) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data = line.slice(5).trim();
        else if (line === "" && event) {
          yield { event, data };
          event = data = "";
        }
      }
    }
  } finally {
    clearTimeout(silent);
  }
}

// One piece of work: false when the store refused the token (a newer holder wrote).
async function write(token) {
  const resp = await fetch(`${store}/increment?token=${token}&writer=node-example`, { method: "POST" });
  return resp.status !== 409;
}

let held;
try {
  held = await hold(lock);
} catch (e) {
  console.error(`could not acquire ${lock}: ${e.message}`);
  process.exit(1);
}
console.log(`acquired ${lock} with fencing token ${held.token}`);
let lost = null;
held.ended.then((why) => (lost = why));
const stop = (why, done) => {
  console.error(`lost ${lock}: ${why}; stopped after ${done} writes`);
  process.exit(75);
};
for (let done = 0; done < items; done++) {
  if (lost) stop(lost, done);
  if (!(await write(held.token))) stop(`the store refused token ${held.token}: a newer holder wrote`, done);
  await new Promise((resolve) => setTimeout(resolve, 100)); // the pace of the work
}
held.release(); // closing the connection releases the hold at once
console.log("released");
