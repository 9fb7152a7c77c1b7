//! A multi-lock acquire on the real node (issue #29 item 1): an app container takes two
//! DistributedLocks as one through its injected sidecar with curl; another pod's try-once
//! acquire of one of them is refused while the set holds; both statuses show the holder and its
//! set; a release of one lock frees both.

use serde_json::Value;
use std::time::Duration;

use crate::common::node::{Node, retry};
use crate::fence::another_pod;

/// The two locks of the set.
const LOCKS: &str = r#"
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: pair-a, namespace: app}
spec: {ttlSeconds: 30}
---
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: pair-b, namespace: app}
spec: {ttlSeconds: 30}
"#;

/// `curl -XPOST $PODLOCK_ADDR/v1/locks/{path} -d BODY` from `pod`'s app container: the status
/// and the JSON answer.
pub fn post(node: &Node, pod: &str, path: &str, body: &str) -> (u16, Value) {
    let script =
        format!("curl -s -w '\\n%{{http_code}}' -XPOST \"$PODLOCK_ADDR/v1/locks/{path}\" -d '{body}'");
    let (ok, out, err) = node.kubectl(&["exec", "-n", "app", pod, "-c", "app", "--", "sh", "-c", &script]);
    assert!(ok, "curl in {pod}: {err}");
    let (json, status) = out.trim().rsplit_once('\n').unwrap_or_else(|| panic!("{out:?}"));
    let answer = serde_json::from_str(json).unwrap_or_else(|e| panic!("{pod} got {json:?}: {e}"));
    (status.parse().unwrap(), answer)
}

/// The holder id of `lock`'s first holder, as its status shows it.
fn status_holder(node: &Node, lock: &str) -> String {
    let path = "jsonpath={.status.holders[0].holderId}";
    node.kubectl(&["get", "dlock", lock, "-n", "app", "-o", path]).1
}

/// Two pods contend for a set of two locks and a lock of it.
pub fn a_pod_takes_two_locks_as_one(node: &Node, holder_pod: &str) {
    node.kubectl_apply(LOCKS);
    let other = another_pod(node, holder_pod);
    let set = r#"{"holderId": "set", "with": ["pair-b"], "waitSeconds": 10}"#;
    let (status, grant) = post(node, holder_pod, "pair-a/acquire", set);
    assert_eq!(status, 200, "{grant}");
    let token = grant["fencingToken"].as_i64().unwrap();
    let locks = grant["locks"].as_array().unwrap();
    assert!(
        locks.iter().all(|l| l["fencingToken"] == token) && locks.len() == 2,
        "{grant}"
    );
    let (status, refused) = post(node, &other, "pair-b/acquire", r#"{"waitSeconds": 0}"#);
    assert_eq!(status, 409, "a lock of a held set was granted: {refused}");
    for lock in ["pair-a", "pair-b"] {
        let shown = retry(Duration::from_secs(10), || {
            let h = status_holder(node, lock);
            (h == "set").then_some(()).ok_or(h)
        });
        assert!(shown.is_ok(), "{lock}'s status shows {:?}", shown.unwrap_err());
    }
    let (status, body) = post(node, holder_pod, "pair-b/release", r#"{"holderId": "set"}"#);
    assert_eq!(status, 200, "{body}");
    let (status, grant) = post(node, &other, "pair-a/acquire", r#"{"waitSeconds": 0}"#);
    assert_eq!(status, 200, "the set's release freed pair-a: {grant}");
    let (status, body) = post(node, &other, "pair-a/release", "{}");
    assert_eq!(status, 200, "{body}");
    let (ok, _, err) = node.kubectl(&["delete", "dlock", "pair-a", "pair-b", "-n", "app", "--wait"]);
    assert!(ok, "delete the set's locks: {err}");
    eprintln!(
        "multi-lock on the node: {holder_pod} held pair-a and pair-b as one (token {token}); {other} was refused pair-b, then took pair-a after one release"
    );
}
