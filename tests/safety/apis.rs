//! The workers that hold through a connection: `POST .../hold` (the hold lasts as long as the
//! connection, which the worker closes to end it) and `podlock lock NAME -- CMD`, run as the
//! real binary. Both record what they asked and were told in the history, under the holder id
//! the grant names (unique per connection or process when the worker names none).

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::client::{Grant, LockClient, Notices, granted_mode};
use super::history::{OpKind, Outcome};
use super::now;
use super::worker::Slot;
use crate::common::podlock_bin;

/// A hold's stream of events after its grant.
type HoldStream = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// How long a worker holds: 20 to 80 ms, by its token, so that holds overlap in every way; a
/// worker with a maximum hold time outstays it on one hold in 8, so that its deadline ends it.
fn hold_time(token: i64, max_hold: Option<u32>) -> Duration {
    match max_hold {
        Some(s) if token.rem_euclid(8) == 0 => Duration::from_secs(s.into()) + Duration::from_millis(500),
        _ => Duration::from_millis(20 + token.rem_euclid(5) as u64 * 15),
    }
}

/// Asks for a hold bound to the connection; the grant (and the client under the holder id it
/// names) and the rest of its stream, or `None` (refused or unanswered, as recorded).
async fn hold(c: &LockClient, addr: &str, call: f64) -> Option<(LockClient, Grant, HoldStream)> {
    let mut options = c.acquire_options();
    if let Some(h) = &c.holder {
        options["holderId"] = json!(h);
    }
    let asked = async {
        let resp = c.streams.post(c.url(addr, "hold")).json(&options).send().await;
        let resp = resp.map_err(|_| None)?;
        if !resp.status().is_success() {
            return Err(Some(resp.status().as_u16()));
        }
        let mut events: HoldStream = Box::pin(resp.bytes_stream().eventsource());
        match events.next().await {
            Some(Ok(first)) if first.event == "acquired" => Ok((first.data, events)),
            _ => Err(None),
        }
    };
    let (first, events) = match timeout(Duration::from_secs(10), asked).await {
        Ok(Ok(granted)) => granted,
        Ok(Err(status)) => return refused(c, "hold", call, Outcome::of_status(status)),
        Err(_) => return refused(c, "hold", call, Outcome::Unknown),
    };
    let g: Value = serde_json::from_str(&first).unwrap_or_default();
    let (Some(token), Some(holder)) = (g["fencingToken"].as_i64(), g["holderId"].as_str()) else {
        return refused(c, "hold", call, Outcome::Unknown);
    };
    let hc = c.with_holder(holder);
    let mode = granted_mode(&g, c.mode);
    hc.record_grant("hold", call, token, mode);
    Some((
        hc,
        Grant {
            token,
            acquired: 0.0,
            call,
            mode,
        },
        events,
    ))
}

/// Records an acquire through `/hold` that got no grant.
fn refused<T>(c: &LockClient, api: &'static str, call: f64, outcome: Outcome) -> Option<T> {
    c.record(OpKind::Acquire, api, call, outcome, 0);
    None
}

/// Holds for `hold_time`, watching the hold's stream (a `deadline` warning goes by); when the
/// stream said the hold ended (`lost`, or the stream ending), if it did.
async fn keep(events: &mut HoldStream, token: i64, max_hold: Option<u32>) -> Option<f64> {
    let held = sleep(hold_time(token, max_hold));
    tokio::pin!(held);
    loop {
        tokio::select! {
            _ = &mut held => return None,
            ev = events.next() => match ev {
                Some(Ok(ev)) if ev.event != "lost" && ev.event != "released" => continue,
                _ => return Some(now()),
            },
        }
    }
}

/// Ends a hold by closing its connection: the release is answered by the `released` event on
/// the lock's events stream (within 2 s), else it stays without answer. A `lost` there instead
/// means the hold had ended before.
async fn close(hc: &LockClient, g: &Grant, events: HoldStream, notices: &Mutex<Notices>) {
    let at = now();
    drop(events);
    for _ in 0..200 {
        let (released, lost) = {
            let n = notices.lock().unwrap();
            (n.released(g.token), n.lost(g.token))
        };
        match (released, lost) {
            (Some(_), _) => return hc.record(OpKind::Release, "close", at, Outcome::Ok, 0),
            (None, Some(told)) => return hc.told(g, g.call, told, true),
            _ => sleep(Duration::from_millis(10)).await,
        }
    }
    hc.record(OpKind::Release, "close", at, Outcome::Unknown, 0);
}

/// Holds through `/hold` until `stop`, each hold ended by closing its connection. A request
/// still waiting on `stop` is dropped: its connection closes, and with it the wait.
pub async fn hold_loop(c: &LockClient, slot: &Slot, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let addr = slot.addr.lock().unwrap().clone();
        let Some((notices, _follower)) = c.follow_events(&addr).await else {
            sleep(Duration::from_millis(100)).await;
            continue;
        };
        let call = now();
        let held = tokio::select! {
            held = hold(c, &addr, call) => held,
            _ = stop.cancelled() => return c.record(OpKind::Acquire, "hold", call, Outcome::Unknown, 0),
        };
        let Some((hc, g, mut events)) = held else {
            sleep(Duration::from_millis(50)).await;
            continue;
        };
        match keep(&mut events, g.token, c.max_hold).await {
            Some(told) => hc.told(&g, g.call, told, true),
            None => close(&hc, &g, events, &notices).await,
        }
    }
}

/// What `podlock lock` runs: it prints its token and holder id, works for 50 ms, says done.
const SCRIPT: &str = r#"echo "$PODLOCK_FENCING_TOKEN $PODLOCK_HOLDER_ID"; sleep 0.05; echo done"#;

/// Runs `podlock lock` until `stop`, one process after another.
pub async fn lock_cmd_loop(c: &LockClient, slot: &Slot, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let addr = slot.addr.lock().unwrap().clone();
        lock_cmd(c, &addr).await;
        sleep(Duration::from_millis(50)).await;
    }
}

/// One run of `podlock lock LOCK -- sh -c SCRIPT` through the sidecar at `addr`. Its grant is
/// the token line; the release is made after `done`, and answered when the process exits
/// (status 0, its release not said to have failed); status 75 says the hold was lost (told
/// no sooner than the exit: `podlock lock` makes no promise of 1 s); 1, not acquired.
async fn lock_cmd(c: &LockClient, addr: &str) {
    let call = now();
    let mut child = tokio::process::Command::new(podlock_bin())
        .args(["lock", c.lock, "--wait", "5", "--", "sh", "-c", SCRIPT])
        .env("PODLOCK_ADDR", addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("podlock lock");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = |l: Result<Result<Option<String>, _>, _>| l.ok()?.ok()?;
    let grant = line(timeout(Duration::from_secs(15), lines.next_line()).await);
    let grant = grant
        .as_deref()
        .and_then(|l| l.split_once(' '))
        .and_then(|(t, h)| {
            let g = Grant {
                token: t.parse().ok()?,
                acquired: 0.0,
                call,
                mode: c.mode,
            };
            let hc = c.with_holder(h);
            hc.record_grant("lock-cmd", call, g.token, g.mode);
            Some((hc, g))
        });
    let done = line(timeout(Duration::from_secs(5), lines.next_line()).await).map(|_| now());
    let status = timeout(Duration::from_secs(10), child.wait()).await;
    if status.is_err() {
        let _ = child.kill().await; // so that its stderr ends
    }
    let code = status.ok().and_then(|s| s.ok()?.code());
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr).await;
    let Some((hc, g)) = grant else {
        let outcome = if code == Some(1) {
            Outcome::Fail
        } else {
            Outcome::Unknown
        };
        return refused(c, "lock-cmd", call, outcome).unwrap_or(());
    };
    match (code, done) {
        (Some(75), _) => hc.told(&g, call, now(), false),
        (Some(0), Some(at)) if !stderr.contains("failed") => {
            hc.record(OpKind::Release, "lock-cmd", at, Outcome::Ok, 0)
        }
        _ => hc.record(
            OpKind::Release,
            "lock-cmd",
            done.unwrap_or(call),
            Outcome::Unknown,
            0,
        ),
    }
}
