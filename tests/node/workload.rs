//! An app Deployment on the node that contends for a lock through its injected sidecar, and
//! what happens to the lock when its holder's pod is deleted or its app container crashes.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

use crate::common::node::{Node, retry};
use crate::common::percentile;

/// The app: serves its pod's name on port 8080 (busybox httpd, for the lock's holder Service),
/// takes the lock `work` through `$PODLOCK_ADDR` with curl and holds it until its pod goes
/// (SIGTERM: exit 0, unless told to ignore it by SIGUSR2) or it is told to crash (SIGUSR1:
/// exit 1). A lock that moves on has therefore moved because its holder died, not because it was
/// released. Only a grant names a `leaseId`: a 409 after the 60 s wait names the holders'
/// tokens too, and must send the app round again, not to sleep as if it held.
const APP: &str = r#"
mkdir -p /tmp/www && hostname >/tmp/www/index.html && httpd -p 8080 -h /tmp/www
trap 'stubborn=1' USR2
trap 'if [ -n "$stubborn" ]; then echo ignoring SIGTERM; else exit 0; fi' TERM
trap 'echo crashing; exit 1' USR1
while true; do
  if [ -z "$PODLOCK_ADDR" ]; then sleep 1 & wait $!; continue; fi
  grant=$(curl -s -XPOST "$PODLOCK_ADDR/v1/locks/work/acquire?waitSeconds=60") || true
  case "$grant" in
    *'"leaseId"'*) echo "granted $grant"; sleep 3600 & wait $! ;;
    *) echo "not granted: $grant"; sleep 1 & wait $! ;;
  esac
done
"#;

/// The Deployment's replicas.
const REPLICAS: u32 = 3;

/// The lock and the app's Deployment, without the injection annotation.
fn manifest(node: &Node) -> String {
    let app = serde_json::to_string(APP).unwrap();
    format!(
        r#"
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {{name: work, namespace: app}}
spec: {{ttlSeconds: 30, holderService: {{ports: [{{port: 80, targetPort: 8080}}]}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: worker, namespace: app}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: worker}}}}
  template:
    metadata: {{labels: {{app: worker}}}}
    spec:
      terminationGracePeriodSeconds: 10
      containers:
        - name: app
          image: {image}
          imagePullPolicy: Never
          command: [/bin/sh, -c, {app}]
"#,
        image = node.images["APP_IMAGE"],
        replicas = REPLICAS,
    )
}

/// Creates the lock and the Deployment, then annotates the Deployment for injection and waits
/// until its pods (now with the sidecar) contend and one holds the lock.
pub async fn deploy(node: &Node) {
    node.kubectl(&["create", "namespace", "app"]);
    node.kubectl_apply(&manifest(node));
    rollout(node);
    let (ok, _, err) = node.kubectl(&[
        "annotate",
        "deployment",
        "worker",
        "-n",
        "app",
        "podlock.io/inject=true",
    ]);
    assert!(ok, "annotate: {err}");
    rollout(node);
    let (_, sidecars, _) = node.kubectl(&[
        "get", "pods", "-n", "app", "-l", "app=worker", "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.initContainers[0].name} {.spec.initContainers[0].image} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]);
    // The rollout is complete; pods of the old ReplicaSet may still be terminating.
    let sidecars: Vec<&str> = sidecars.lines().filter(|l| l.ends_with(' ')).collect();
    let sidecars = sidecars.join("\n");
    eprintln!("pods after `kubectl annotate deployment worker podlock.io/inject=true`:\n{sidecars}");
    assert!(
        sidecars.lines().all(|l| l.contains(" podlock ")),
        "pods without the sidecar: {sidecars}"
    );
    let holder = retry(Duration::from_secs(60), || {
        status(node)
            .filter(|s| s.waiters >= 1)
            .ok_or("no holder and waiter".into())
    });
    assert!(
        holder.is_ok(),
        "nobody holds the lock: {:?}\n{}",
        status(node),
        logs(node)
    );
    let (_, table, _) = node.kubectl(&["get", "dlock", "-n", "app"]);
    eprintln!("kubectl get dlock -n app:\n{table}");
    assert!(table.contains(&holder.unwrap().pod), "{table}");
}

pub fn rollout(node: &Node) {
    let (ok, out, err) = node.kubectl(&[
        "rollout",
        "status",
        "deployment/worker",
        "-n",
        "app",
        "--timeout=180s",
    ]);
    if !ok {
        let (_, pods, _) = node.kubectl(&["get", "pods", "-n", "app", "-o", "wide"]);
        let (_, events, _) = node.kubectl(&["get", "events", "-n", "app", "--sort-by=.lastTimestamp"]);
        let events: Vec<&str> = events.lines().rev().take(25).collect();
        panic!(
            "rollout: {out}{err}\n{pods}\nlast events:\n{}\n{}",
            events.join("\n"),
            logs(node)
        );
    }
}

/// The first holder of `work` as its status shows it.
#[derive(Debug, Clone)]
pub struct Holder {
    pub pod: String,
    acquired_at: SystemTime,
    token: String,
    waiters: u32,
}

fn status(node: &Node) -> Option<Holder> {
    let (_, out, _) = node.kubectl(&[
        "get", "dlock", "work", "-n", "app", "-o",
        "jsonpath={.status.holders[0].pod} {.status.holders[0].acquiredAt} {.status.holders[0].fencingToken} {.status.waiters}",
    ]);
    let f: Vec<&str> = out.split(' ').collect();
    Some(Holder {
        pod: f.first().filter(|p| !p.is_empty())?.to_string(),
        acquired_at: humantime::parse_rfc3339(f.get(1)?).ok()?,
        token: f.get(2)?.to_string(),
        waiters: f.get(3)?.parse().unwrap_or(0),
    })
}

pub fn logs(node: &Node) -> String {
    node.kubectl(&[
        "logs",
        "-n",
        "app",
        "-l",
        "app=worker",
        "--all-containers",
        "--prefix",
        "--tail=5",
    ])
    .1
}

/// Waits until a pod other than `old` holds the lock, granted after `t0`; returns the new
/// holder. A mutex hold's `acquiredAt` reads as its `requestedAt` until the hold has lasted
/// 100 ms (docs/design.md): a fresh holder is taken once its grant time is written.
fn next_holder(node: &Node, old: &str, t0: SystemTime) -> Holder {
    let next = retry(Duration::from_secs(40), || {
        status(node)
            .filter(|h| h.pod != old && h.acquired_at >= t0 - Duration::from_millis(1))
            .ok_or(format!(
                "{old} still holds, or its successor's grant time is not written yet"
            ))
    });
    let next = next.unwrap_or_else(|e| panic!("{e}: {:?}\n{}", status(node), logs(node)));
    // The holder's app container got that grant from its sidecar.
    let (_, log, _) = node.kubectl(&["logs", "-n", "app", &next.pod, "-c", "app"]);
    let granted = format!("\"fencingToken\":{}", next.token);
    assert!(
        log.contains(&granted),
        "{} holds token {} but its app did not print it:\n{log}",
        next.pod,
        next.token
    );
    next
}

/// Waits until a pod other than `old`'s holds the lock; prints `what` with who got the lock
/// and how long after `t0`, and returns that time.
pub fn handed_on(node: &Node, old: &Holder, t0: SystemTime, what: &str) -> Duration {
    let next = next_holder(node, &old.pod, t0);
    let took = since(t0, &next);
    eprintln!("{what}: {} got the lock {} ms later", next.pod, took.as_millis());
    took
}

fn since(t0: SystemTime, holder: &Holder) -> Duration {
    // acquiredAt has millisecond precision: a grant in the same millisecond as t0 reads as 0.
    holder
        .acquired_at
        .duration_since(t0 - Duration::from_millis(1))
        .unwrap_or_else(|_| panic!("{} was granted before the change it should follow", holder.pod))
}

/// Waits until every replica runs and every one but the holder waits in the lock's queue.
pub fn settled(node: &Node) -> Holder {
    rollout(node);
    retry(Duration::from_secs(90), || {
        status(node)
            .filter(|s| s.waiters == REPLICAS - 1)
            .ok_or(format!("not one holder and {} waiters", REPLICAS - 1))
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", status(node), logs(node)))
}

/// The operator's `podlock_forced_releases_total`, from every operator pod (only the leader acts).
pub async fn forced_releases(node: &Node) -> String {
    let (_, ips, _) = node.kubectl(&[
        "get",
        "pods",
        "-n",
        "podlock",
        "-l",
        "app.kubernetes.io/component=podlock-operator",
        "-o",
        "jsonpath={.items[*].status.podIP}",
    ]);
    let mut out = vec![];
    for ip in ips.split_whitespace() {
        let text = reqwest::get(format!("http://{ip}:8080/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        out.extend(
            text.lines()
                .filter(|l| l.starts_with("podlock_forced_releases_total"))
                .map(str::to_string),
        );
    }
    if out.is_empty() {
        return "no forced releases".into();
    }
    out.join(", ")
}

/// Deletes the holder's Pod, several times: the next waiter must get the lock within 1 s.
pub async fn pod_deletion_hands_the_lock_on(node: &Node, client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "app");
    let trials: usize = std::env::var("PODLOCK_NODE_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let mut handoffs = vec![];
    for trial in 0..trials {
        let holder = settled(node);
        let t0 = SystemTime::now();
        pods.delete(&holder.pod, &DeleteParams::default()).await.unwrap();
        let next = next_holder(node, &holder.pod, t0);
        let took = since(t0, &next);
        eprintln!(
            "trial {trial}: deleted {}; {} got the lock {} ms later",
            holder.pod,
            next.pod,
            took.as_millis()
        );
        handoffs.push(took);
    }
    let (p50, p99) = (percentile(&mut handoffs, 0.5), percentile(&mut handoffs, 0.99));
    eprintln!(
        "pod deleted -> next waiter granted, real kubelet, {trials} trials, lock TTL 30 s: p50 {} ms, p99 {} ms",
        p50.as_millis(),
        p99.as_millis()
    );
    eprintln!("operator: {}", forced_releases(node).await);
    assert!(
        p99 < Duration::from_secs(1),
        "handoff after pod deletion p99 {p99:?}"
    );
}

/// Sends `signal` (e.g. `-USR1`) to the app container's PID 1 in `pod`; returns whether the
/// exec succeeded.
pub fn signal_app(node: &Node, pod: &str, signal: &str) -> (bool, String) {
    let args = ["exec", "-n", "app", pod, "-c", "app", "--", "kill", signal, "1"];
    let (ok, _, err) = node.kubectl(&args);
    (ok, err)
}

/// Crashes the holder's app container (exit 1; the kubelet restarts it): its hold must end.
pub async fn app_crash_ends_the_hold(node: &Node) {
    let holder = settled(node);
    let t0 = SystemTime::now();
    // The exec'd kill dies with the container it signals: its exit status tells nothing.
    signal_app(node, &holder.pod, "-USR1");
    let what = format!(
        "app container of {} crashed (exit 1, restarted by the kubelet)",
        holder.pod
    );
    let took = handed_on(node, &holder, t0, &what);
    let restarted = retry(Duration::from_secs(30), || {
        let (_, out, _) = node.kubectl(&[
            "get", "pod", "-n", "app", &holder.pod, "-o",
            r#"jsonpath={.status.containerStatuses[?(@.name=="app")].restartCount} {.status.containerStatuses[?(@.name=="app")].lastState.terminated.exitCode}"#,
        ]);
        (out.split(' ').next() != Some("0") && out.ends_with(" 1"))
            .then_some(())
            .ok_or(out)
    });
    assert!(
        restarted.is_ok(),
        "the app container did not exit 1 and restart: {restarted:?}"
    );
    // The kubelet reports a dead container on its next relist (about 1 s); the operator then acts.
    assert!(
        took < Duration::from_secs(5),
        "hold outlived the crash by {took:?}"
    );
}

/// Deletes the app and the lock; the lock's etcd keys must go with it.
pub async fn remove(node: &Node) {
    node.kubectl(&[
        "delete",
        "deployment",
        "worker",
        "-n",
        "app",
        "--wait=true",
        "--timeout=60s",
    ]);
    let (ok, _, err) = node.kubectl(&[
        "delete",
        "dlock",
        "work",
        "-n",
        "app",
        "--wait=true",
        "--timeout=60s",
    ]);
    assert!(ok, "delete dlock: {err}");
    let (_, password, _) = node.kubectl(&[
        "get",
        "secret",
        "podlock-etcd-root",
        "-n",
        "podlock",
        "-o",
        "go-template={{.data.password | base64decode}}",
    ]);
    let root = format!("--user=root:{password}");
    let keys = retry(Duration::from_secs(20), || {
        let (ok, out, err) = node.kubectl(&[
            "exec",
            "-n",
            "podlock",
            "podlock-etcd-0",
            "--",
            "etcdctl",
            "--endpoints=https://127.0.0.1:2379",
            "--cacert=/etc/etcd/tls/ca.crt",
            &root,
            "get",
            "--prefix",
            "/podlock/",
            "--keys-only",
        ]);
        if !ok {
            return Err(err);
        }
        // What stays is each namespace's etcd password and the record of what its Secret
        // holds, kept for that Secret (docs/operator.md).
        let kept = ["/podlock/v1/credentials/", "/podlock/v1/secrets/"];
        let left: Vec<&str> = out
            .split_whitespace()
            .filter(|k| !kept.iter().any(|prefix| k.starts_with(prefix)))
            .collect();
        left.is_empty().then_some(()).ok_or(left.join(" "))
    });
    assert!(
        keys.is_ok(),
        "etcd keys left after the lock was deleted: {keys:?}"
    );
}
