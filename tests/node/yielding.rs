//! A request to yield on the real node (issue #44 item 2): an injected pod's app holds a lock
//! through its sidecar with `curl -N .../hold`; an administrator asks it to yield with `kubectl
//! annotate dlock NAME podlock.io/yield=HOLDER podlock.io/yield-grace=3s`; the hold's stream
//! gets a `yield` event with the deadline and, as the app does not release, `lost` with reason
//! `yield` at the deadline, and another injected pod waiting for the lock is granted then, with
//! a larger token.

use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};
use crate::deadline::event_data;
use crate::fence::another_pod;
use crate::multi::post;

/// The lock.
const LOCK: &str = r#"
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: asked, namespace: app}
spec: {ttlSeconds: 30}
"#;

/// `curl -N` of a `/hold` of `asked` as holder `stubborn` in `pod`'s app container: the whole
/// stream (it ends after `lost`), within 20 s.
fn hold_stream(node: &Node, pod: &str) -> (bool, String, String) {
    let script =
        r#"curl -sN --max-time 20 -XPOST "$PODLOCK_ADDR/v1/locks/asked/hold" -d '{"holderId": "stubborn"}'"#;
    node.kubectl(&["exec", "-n", "app", pod, "-c", "app", "--", "sh", "-c", script])
}

/// `holder_pod`'s hold, asked to yield and not released, ends at the request's deadline and
/// `another` injected pod, waiting, is granted then.
pub fn a_holder_asked_to_yield_is_told_then_ended_and_the_next_pod_is_granted(node: &Node, holder_pod: &str) {
    node.kubectl_apply(LOCK);
    let other = another_pod(node, holder_pod);
    // Until the operator has published the lock, the sidecar answers 404.
    let probe = r#"{"holderId": "probe", "waitSeconds": 0}"#;
    let free = retry(Duration::from_secs(10), || {
        match post(node, &other, "asked/acquire", probe) {
            (404, body) => Err(body.to_string()),
            answer => Ok(answer),
        }
    });
    let (status, body) = free.expect("the lock was published");
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(node, &other, "asked/release", r#"{"holderId": "probe"}"#);
    assert_eq!(status, 200, "{body}");
    let ((ok, out, err), (status, next), asked) = std::thread::scope(|scope| {
        let stream = scope.spawn(|| hold_stream(node, holder_pod));
        std::thread::sleep(Duration::from_secs(2)); // the hold is granted meanwhile: the lock is free
        let ask = [
            "annotate",
            "dlock",
            "asked",
            "-n",
            "app",
            "podlock.io/yield=stubborn",
            "podlock.io/yield-grace=3s",
        ];
        let (ok, _, err) = node.kubectl(&ask);
        assert!(ok, "annotate: {err}");
        let asked = Instant::now();
        let next = post(node, &other, "asked/acquire", r#"{"waitSeconds": 20}"#);
        (stream.join().unwrap(), next, asked)
    });
    let granted = asked.elapsed();
    assert_eq!(status, 200, "{next}");
    assert!(ok, "curl of the hold in {holder_pod}: {err}");
    let grant = event_data(&out, "acquired");
    let told = event_data(&out, "yield");
    assert_eq!(told["fencingToken"], grant["fencingToken"], "{out}");
    assert!(told["deadline"].is_string(), "{told}");
    assert_eq!(event_data(&out, "lost")["reason"], "yield", "{out}");
    assert!(
        next["fencingToken"].as_i64() > grant["fencingToken"].as_i64(),
        "{next}"
    );
    assert!(
        granted > Duration::from_secs(2) && granted < Duration::from_secs(8),
        "{other} was granted {granted:?} after the request (grace 3 s)"
    );
    let (status, body) = post(node, &other, "asked/release", "{}");
    assert_eq!(status, 200, "{body}");
    let (ok, _, err) = node.kubectl(&["delete", "dlock", "asked", "-n", "app", "--wait"]);
    assert!(ok, "delete the lock: {err}");
    eprintln!(
        "yield on the node: {holder_pod}'s hold was told to yield, then ended at the deadline \
         (lost: yield); {other} was granted {granted:?} after kubectl annotate"
    );
}
