//! `helm upgrade` with live holds: while injected pods take turns on a mutex and a semaphore
//! of 2, the CRD is applied again and the release is upgraded to a new image tag and a changed
//! value (etcd's compaction retention, so the bundled etcd's members roll too, one at a time,
//! as do the operator's replicas and its webhook). No hold is lost (every release answers
//! 200), none overlaps another beyond the lock's limit, no acquire fails during the upgrade,
//! grants follow the queue (tokens rise in grant order), and the longest time the mutex had no
//! holder is printed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};
use crate::{CHART, helm_upgrade};

/// The contending pods (each takes both locks).
const CONTENDERS: usize = 3;

/// A contender: takes `$LOCK`, tells the recorder (after the grant, and before the release),
/// holds for `$HOLD` seconds, releases and tells the recorder the release's HTTP status.
const CONTENDER: &str = r#"
trap 'exit 0' TERM
say() { curl -s -o /dev/null "$RECORDER/$1?lock=$LOCK&pod=$(hostname)&token=$2&code=$3"; }
while true; do
  if [ -z "$PODLOCK_ADDR" ]; then sleep 1 & wait $!; continue; fi
  grant=$(curl -s -XPOST "$PODLOCK_ADDR/v1/locks/$LOCK/acquire?waitSeconds=120") || true
  token=$(echo "$grant" | sed -n 's/.*"fencingToken":\([0-9]*\).*/\1/p')
  if [ -z "$token" ]; then say refused 0 "$(echo "$grant" | tr -c 'a-z_' _ | cut -c1-240)"; sleep 1 & wait $!; continue; fi
  say acquired "$token" 0
  sleep "$HOLD" & wait $!
  say releasing "$token" 0
  code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$PODLOCK_ADDR/v1/locks/$LOCK/release")
  say released "$token" "$code"
done
"#;

/// One report of a contender, as the recorder received it.
#[derive(Debug, Clone)]
struct Event {
    at: Instant,
    kind: String,
    lock: String,
    pod: String,
    token: u64,
    code: String,
}

/// An HTTP recorder on the pod bridge's address: every request's path and query becomes an
/// [`Event`], stamped on arrival.
fn recorder() -> (String, Arc<Mutex<Vec<Event>>>) {
    let listener = TcpListener::bind("10.244.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(&stream).read_line(&mut line);
            if let Some(event) = parse(&line) {
                sink.lock().unwrap().push(event);
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, events)
}

/// `GET /KIND?lock=L&pod=P&token=T&code=C HTTP/1.1` as an [`Event`].
fn parse(request: &str) -> Option<Event> {
    let target = request.split(' ').nth(1)?;
    let (kind, query) = target.trim_start_matches('/').split_once('?')?;
    let field: BTreeMap<&str, &str> = query.split('&').filter_map(|kv| kv.split_once('=')).collect();
    Some(Event {
        at: Instant::now(),
        kind: kind.into(),
        lock: field.get("lock")?.to_string(),
        pod: field.get("pod")?.to_string(),
        token: field.get("token")?.parse().ok()?,
        code: field.get("code").unwrap_or(&"").to_string(),
    })
}

/// The locks and a Deployment of 3 injected pods, each with a contender per lock.
fn manifest(node: &Node, recorder: &str) -> String {
    let script = serde_json::to_string(CONTENDER).unwrap();
    let container = |lock: &str, hold: &str| {
        format!(
            "{{name: {lock}, image: {image}, imagePullPolicy: Never, command: [/bin/sh, -c, {script}], \
             env: [{{name: LOCK, value: {lock}}}, {{name: HOLD, value: \"{hold}\"}}, {{name: RECORDER, value: \"{recorder}\"}}]}}",
            image = node.images["APP_IMAGE"]
        )
    };
    format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: mutex, namespace: upgrade}}\nspec: {{}}\n---\n\
         apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: semaphore, namespace: upgrade}}\nspec: {{maxHolders: 2}}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: contenders, namespace: upgrade}}\n\
         spec:\n  replicas: {CONTENDERS}\n  selector: {{matchLabels: {{app: contenders}}}}\n  template:\n    \
         metadata: {{labels: {{app: contenders}}, annotations: {{podlock.io/inject: \"true\"}}}}\n    \
         spec:\n      terminationGracePeriodSeconds: 5\n      containers:\n      - {}\n      - {}\n",
        container("mutex", "0.5"),
        container("semaphore", "1")
    )
}

/// Upgrades the release to `tag` with live holds on both locks and checks them; returns once
/// every operator runs the new image.
pub fn live_holds_survive_helm_upgrade(node: &Node, tag: &str) {
    let (url, events) = recorder();
    node.kubectl(&["create", "namespace", "upgrade"]);
    node.kubectl_apply(&manifest(node, &url));
    // Every pod's sidecar has reached etcd (each pod was granted both locks) before the
    // upgrade: a new pod's first acquires may be answered 503 until then, and the app retries.
    let contending = retry(Duration::from_secs(180), || {
        let events = events.lock().unwrap();
        let n = events.iter().filter(|e| e.kind == "released").count();
        let granted: BTreeSet<(&str, &str)> = (events.iter())
            .filter(|e| e.kind == "acquired")
            .map(|e| (e.pod.as_str(), e.lock.as_str()))
            .collect();
        let all = n >= 6 && granted.len() == 2 * CONTENDERS;
        all.then_some(()).ok_or(format!(
            "{n} holds released so far; (pod, lock) pairs granted: {granted:?}"
        ))
    });
    let (_, pods, _) = node.kubectl(&["get", "pods", "-n", "upgrade", "-o", "wide"]);
    assert!(
        contending.is_ok(),
        "the contenders do not take turns: {contending:?}\n{pods}"
    );
    let start = Instant::now();
    let crd = format!("{CHART}/crds/distributedlock.yaml");
    let (ok, _, err) = node.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crd]);
    assert!(ok, "kubectl apply of the CRD: {err}");
    let image = format!("image.tag={tag}");
    let (ok, out, err) = helm_upgrade(node, &[&image, "etcd.bundled.compactionRetention=2h"]);
    assert!(ok, "helm upgrade: {out}{err}");
    let upgraded = start.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let window = events.lock().unwrap().clone();
    let diagnosis = diagnose(node);
    node.kubectl(&["delete", "namespace", "upgrade", "--wait=false"]);
    eprintln!(
        "helm upgrade with live holds: took {:.1} s",
        upgraded.as_secs_f64()
    );
    for lock in ["mutex", "semaphore"] {
        let limit = if lock == "mutex" { 1 } else { 2 };
        let mine: Vec<&Event> = window.iter().filter(|e| e.lock == lock).collect();
        check(lock, limit, &mine, start, &diagnosis);
    }
}

/// The checks of one lock's events: no acquire refused from the upgrade on (before it, every
/// pod was granted both locks: a new pod's first acquires may come before its sidecar reached
/// etcd, 503, and the app retries), no
/// lost hold, at most `limit` holders at once, tokens rising in grant order (mutex), and the
/// longest gap without a holder printed.
fn check(lock: &str, limit: usize, events: &[&Event], upgrade: Instant, diagnosis: &str) {
    let refused: Vec<String> = (events.iter())
        .filter(|e| e.kind == "refused" && e.at >= upgrade)
        .map(|e| format!("{} ({})", e.pod, e.code))
        .collect();
    assert!(
        refused.is_empty(),
        "{lock}: acquires failed during the upgrade: {refused:?}\n{diagnosis}"
    );
    let lost: Vec<String> = (events.iter())
        .filter(|e| e.kind == "released" && e.code != "200")
        .map(|e| format!("token {} of {}: release answered {}", e.token, e.pod, e.code))
        .collect();
    assert!(lost.is_empty(), "{lock}: holds lost: {lost:?}\n{diagnosis}");
    let (mut holding, mut last_token, mut gap_from) = (Vec::<u64>::new(), 0, None::<Instant>);
    let (mut longest_gap, mut grants) = (Duration::ZERO, 0);
    for e in events {
        match e.kind.as_str() {
            "acquired" => {
                assert!(
                    limit > 1 || e.token > last_token,
                    "{lock}: token {} granted after {last_token}",
                    e.token
                );
                last_token = last_token.max(e.token);
                holding.push(e.token);
                assert!(
                    holding.len() <= limit,
                    "{lock}: {holding:?} hold at once (limit {limit})"
                );
                if let Some(from) = gap_from.take().filter(|_| e.at > upgrade) {
                    longest_gap = longest_gap.max(e.at - from);
                }
                grants += 1;
            }
            "releasing" => {
                holding.retain(|t| *t != e.token);
                gap_from = holding.is_empty().then_some(e.at);
            }
            _ => {}
        }
    }
    eprintln!(
        "{lock} (limit {limit}): {grants} grants, 0 refused during the upgrade, 0 lost, at most {limit} at once; \
         longest time without a holder from the upgrade on: {} ms",
        longest_gap.as_millis()
    );
}

/// For a failure: the contenders' sidecar logs, the operators' logs and the namespace's Events.
fn diagnose(node: &Node) -> String {
    let logs = |args: &[&str]| node.kubectl(args).1;
    format!(
        "--- sidecars\n{}\n--- operators\n{}\n--- events\n{}",
        logs(&[
            "logs",
            "-n",
            "upgrade",
            "-l",
            "app=contenders",
            "-c",
            "podlock",
            "--tail",
            "40",
            "--prefix"
        ]),
        operator_logs(node, 60),
        logs(&["get", "events", "-n", "upgrade", "--sort-by=.lastTimestamp"]),
    )
}

/// The last `lines` lines of every operator replica's log, each line prefixed with its pod.
pub fn operator_logs(node: &Node, lines: usize) -> String {
    let tail = lines.to_string();
    let selector = "app.kubernetes.io/component=podlock-operator";
    let args = [
        "logs", "-n", "podlock", "-l", selector, "--tail", &tail, "--prefix",
    ];
    node.kubectl(&args).1
}
