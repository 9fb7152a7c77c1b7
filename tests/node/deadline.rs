//! A maximum hold time on the real node (issue #44 item 1): a DistributedLock with
//! `spec.maxHoldSeconds`, taken by an injected pod's app through its sidecar with curl. An
//! acquire asking for more than the lock allows is refused naming the limit; a hold bound to
//! its connection gets its `deadline` event, then `lost` with reason `deadline` at the deadline,
//! and another injected pod waiting for the lock is granted then, with a larger token.

use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};
use crate::fence::another_pod;
use crate::multi::post;

/// The lock: every hold ends after 5 s at the latest.
const LOCK: &str = r#"
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: capped, namespace: app}
spec: {ttlSeconds: 30, maxHoldSeconds: 5}
"#;

/// `curl -N` of a `/hold` of `capped` in `pod`'s app container: the whole stream (it ends
/// after `lost`), within 20 s.
fn hold_stream(node: &Node, pod: &str) -> (bool, String, String) {
    let script =
        r#"curl -sN --max-time 20 -XPOST "$PODLOCK_ADDR/v1/locks/capped/hold" -d '{"holderId": "timed"}'"#;
    node.kubectl(&["exec", "-n", "app", pod, "-c", "app", "--", "sh", "-c", script])
}

/// The data of the stream's event `name` (`event: NAME` then `data: {...}`).
pub fn event_data(stream: &str, name: &str) -> serde_json::Value {
    let mut lines = stream.lines().skip_while(|l| *l != format!("event: {name}"));
    let data = lines.nth(1).and_then(|l| l.strip_prefix("data: "));
    let data = data.unwrap_or_else(|| panic!("no {name} event in the hold's stream:\n{stream}"));
    serde_json::from_str(data).unwrap()
}

/// The hold of `holder_pod` ends at its deadline and `another` injected pod, waiting, is
/// granted then.
pub fn a_hold_ends_at_its_deadline_and_the_next_pod_is_granted(node: &Node, holder_pod: &str) {
    node.kubectl_apply(LOCK);
    let other = another_pod(node, holder_pod);
    // Until the operator has published the lock, the sidecar answers 404.
    let refused = retry(Duration::from_secs(10), || {
        match post(node, holder_pod, "capped/acquire", r#"{"maxHoldSeconds": 60}"#) {
            (404, body) => Err(body.to_string()),
            answer => Ok(answer),
        }
    });
    let (status, refused) = refused.expect("the lock was published");
    assert_eq!(
        (status, &refused["maxHoldSeconds"]),
        (400, &5.into()),
        "{refused}"
    );
    let started = Instant::now();
    let ((ok, out, err), (status, next), granted) = std::thread::scope(|scope| {
        let stream = scope.spawn(|| hold_stream(node, holder_pod));
        std::thread::sleep(Duration::from_secs(2)); // the hold is granted meanwhile: the lock is free
        let next = post(node, &other, "capped/acquire", r#"{"waitSeconds": 20}"#);
        let granted = started.elapsed();
        (stream.join().unwrap(), next, granted)
    });
    assert_eq!(status, 200, "{next}");
    assert!(ok, "curl of the hold in {holder_pod}: {err}");
    let grant = event_data(&out, "acquired");
    assert_eq!(grant["maxHoldSeconds"], 5, "{grant}");
    assert_eq!(
        event_data(&out, "deadline")["deadline"],
        grant["deadline"],
        "{out}"
    );
    assert_eq!(event_data(&out, "lost")["reason"], "deadline", "{out}");
    assert!(
        next["fencingToken"].as_i64() > grant["fencingToken"].as_i64(),
        "{next}"
    );
    assert!(
        granted < Duration::from_secs(12),
        "{other} was granted {granted:?} after the hold began"
    );
    let (status, body) = post(node, &other, "capped/release", "{}");
    assert_eq!(status, 200, "{body}");
    let (ok, _, err) = node.kubectl(&["delete", "dlock", "capped", "-n", "app", "--wait"]);
    assert!(ok, "delete the lock: {err}");
    eprintln!(
        "maxHoldSeconds on the node: {holder_pod}'s hold ended at its deadline (lost: deadline); \
         {other} was granted {granted:?} after the hold began"
    );
}
