//! The fence check on the real node (issue #29 item 2): an app container asks its injected
//! sidecar with curl whether the holder's token is current, from the holder's pod and from a
//! waiter's, and `podlock fence` in a sidecar's container says the same in its exit status.

use serde_json::Value;

use crate::common::node::Node;
use crate::workload::settled;

/// The first holder of `work` as its status shows it: its pod and token.
pub fn holder(node: &Node) -> (String, i64) {
    let (_, out, _) = node.kubectl(&[
        "get",
        "dlock",
        "work",
        "-n",
        "app",
        "-o",
        "jsonpath={.status.holders[0].pod} {.status.holders[0].fencingToken}",
    ]);
    let (pod, token) = out
        .split_once(' ')
        .unwrap_or_else(|| panic!("no holder: {out:?}"));
    (pod.to_string(), token.trim().parse().unwrap())
}

/// A running worker pod other than `holder`.
pub fn another_pod(node: &Node, holder: &str) -> String {
    let (_, out, _) = node.kubectl(&[
        "get",
        "pods",
        "-n",
        "app",
        "-l",
        "app=worker",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]);
    let mut live = out.lines().filter(|l| l.ends_with(' ')).map(str::trim);
    live.find(|p| *p != holder)
        .unwrap_or_else(|| panic!("no pod but {holder}: {out}"))
        .to_string()
}

/// `GET $PODLOCK_ADDR/v1/locks/work/fence?token=TOKEN` with curl from `pod`'s app container.
pub fn curl_fence(node: &Node, pod: &str, token: i64) -> Value {
    let script = format!("curl -s \"$PODLOCK_ADDR/v1/locks/work/fence?token={token}\"");
    let (ok, out, err) = node.kubectl(&["exec", "-n", "app", pod, "-c", "app", "--", "sh", "-c", &script]);
    assert!(ok, "curl in {pod}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{pod} got {out:?}: {e}"))
}

/// `podlock fence work TOKEN` in `pod`'s sidecar container: whether it exited 0, and stdout.
fn podlock_fence(node: &Node, pod: &str, token: i64) -> (bool, String) {
    let token = token.to_string();
    let args = ["exec", "-n", "app", pod, "-c", "podlock", "--"];
    let cmd = ["/usr/local/bin/podlock", "fence", "work", &token];
    let (ok, out, _) = node.kubectl(&[&args[..], &cmd[..]].concat());
    (ok, out)
}

/// The holder's token is current from every pod of the namespace; an older one is not, and its
/// answer names the holder's token. Returns the holder's pod.
pub fn any_pod_checks_the_holders_token(node: &Node) -> String {
    settled(node);
    let (pod, token) = holder(node);
    let waiter = another_pod(node, &pod);
    for asker in [&pod, &waiter] {
        let answer = curl_fence(node, asker, token);
        assert_eq!(answer["current"], true, "asked from {asker}: {answer}");
        assert_eq!(answer["holders"][0]["pod"], pod.as_str(), "{answer}");
    }
    let stale = curl_fence(node, &waiter, token - 1);
    assert_eq!(stale["current"], false, "{stale}");
    assert_eq!(stale["holders"][0]["fencingToken"], token, "{stale}");
    let (current, out) = podlock_fence(node, &waiter, token);
    assert!(current, "podlock fence work {token} in {waiter}: {out}");
    let (current, out) = podlock_fence(node, &waiter, token - 1);
    assert!(
        !current && out.contains(&format!("\"fencingToken\":{token}")),
        "{out}"
    );
    eprintln!(
        "fence check on the node: {pod}'s token {token} current from {pod} and {waiter}; {} not",
        token - 1
    );
    pod
}
