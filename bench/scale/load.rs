//! Load on the fleet: a steady stream of handoffs across many locks (with the time each grant
//! takes to show in its DistributedLock's status), one lock with a long queue, and one sidecar
//! with many holds.

use futures::StreamExt;
use kube::Api;
use kube::runtime::watcher;
use podlock::crd::DistributedLock;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

use crate::common::kube::ControlPlane;
use crate::common::{Sidecar, wait_until};
use crate::fleet::lock;

/// (namespace, lock, fencing token) of one grant.
type GrantKey = (String, String, i64);

/// (namespace, lock).
type LockKey = (String, String);

/// When each grant was made (by the client), and when each lock's status first showed a
/// holder of a higher fencing token than before (by a watch).
#[derive(Default)]
struct Seen {
    granted: HashMap<GrantKey, Instant>,
    shown: HashMap<LockKey, Vec<(Instant, i64)>>,
}

impl Seen {
    /// When the status of the grant's lock first showed its holder or a later one (a lock's
    /// tokens rise with each grant; a status written once for several grants shows the last).
    fn in_status(&self, (ns, lock, token): &GrantKey) -> Option<Instant> {
        let shown = self.shown.get(&(ns.clone(), lock.clone()))?;
        let at = shown.partition_point(|(_, highest)| highest < token);
        shown.get(at).map(|(when, _)| *when)
    }
}

/// What the steady load measured.
pub struct Steady {
    /// Grants made.
    pub grants: usize,
    /// Grant to status, for the grants that showed in status.
    pub lags: Vec<Duration>,
    /// Grants whose status never showed them or a later holder.
    pub unseen: usize,
}

/// `clients` holder ids take turns on `clients / 5` locks (five per lock, spread over the
/// namespaces of `sidecars`, one list of sidecars per namespace, alternating between them),
/// each hold lasting `hold`, for `window`: `clients / 5 / hold` handoffs per second.
pub async fn steady(
    plane: &ControlPlane,
    sidecars: &[Vec<Arc<Sidecar>>],
    clients: usize,
    hold: Duration,
    window: Duration,
) -> Steady {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (listed, ready) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(watch_status(plane.client().await, seen.clone(), listed));
    // Grants made while the watch still lists every lock would be seen when the list ends.
    ready.await.expect("the status watch lists every lock");
    let stop = Instant::now() + window;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (group, member) = (c / 5, c % 5);
            let pods = &sidecars[group % sidecars.len()];
            let sidecar = pods[member % pods.len()].clone();
            let (seen, lock) = (seen.clone(), lock(1 + group / sidecars.len()));
            tokio::spawn(async move {
                let holder = format!("client-{c}");
                let ns = namespace_of(&sidecar);
                while Instant::now() < stop {
                    let token = sidecar
                        .must_acquire(&lock, json!({"holderId": holder, "waitSeconds": 600}))
                        .await;
                    seen.lock()
                        .unwrap()
                        .granted
                        .insert((ns.clone(), lock.clone(), token), Instant::now());
                    tokio::time::sleep(hold).await;
                    let (status, body) = sidecar.post(&lock, "release", json!({"holderId": holder})).await;
                    assert_eq!(status, 200, "release: {body}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // the last statuses
    watch.abort();
    let seen = seen.lock().unwrap();
    let lags: Vec<Duration> = (seen.granted.iter())
        .filter_map(|(k, at)| Some(seen.in_status(k)?.saturating_duration_since(*at)))
        .collect();
    Steady {
        grants: seen.granted.len(),
        unseen: seen.granted.len() - lags.len(),
        lags,
    }
}

/// Records when each lock's status first shows a higher fencing token among its holders;
/// `listed` once the watch has listed every lock.
async fn watch_status(client: kube::Client, seen: Arc<Mutex<Seen>>, listed: oneshot::Sender<()>) {
    let api: Api<DistributedLock> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let mut listed = Some(listed);
    while let Some(Ok(event)) = events.next().await {
        let dl = match event {
            watcher::Event::Apply(dl) | watcher::Event::InitApply(dl) => dl,
            watcher::Event::InitDone => {
                listed.take().map(|l| l.send(()));
                continue;
            }
            watcher::Event::Init | watcher::Event::Delete(_) => continue,
        };
        let now = Instant::now();
        let key = (
            dl.metadata.namespace.unwrap_or_default(),
            dl.metadata.name.unwrap_or_default(),
        );
        let holders = dl.status.map(|s| s.holders).unwrap_or_default();
        let Some(highest) = holders.iter().map(|h| h.fencing_token).max() else {
            continue;
        };
        let mut seen = seen.lock().unwrap();
        let shown = seen.shown.entry(key).or_default();
        if shown.last().is_none_or(|(_, before)| *before < highest) {
            shown.push((now, highest));
        }
    }
}

/// The namespace a sidecar serves (its pod name is `NAMESPACE.N`).
fn namespace_of(s: &Sidecar) -> String {
    s.pod.split('.').next().unwrap().to_string()
}

/// Starts `count` sidecars for namespace `ns`.
pub async fn sidecars(plane: &ControlPlane, ns: &str, count: usize) -> Vec<Arc<Sidecar>> {
    let mut out = vec![];
    for i in 0..count {
        let pod = format!("{ns}.{i}");
        out.push(Arc::new(
            Sidecar::start(&plane.etcd.endpoint, &pod, &["--namespace", ns]).await,
        ));
    }
    out
}

/// How often a waiter of the long queue sends its acquire before it gives up.
const MAX_ATTEMPTS: u32 = 5;

/// What the long queue measured.
pub struct LongQueue {
    /// etcd requests per grant, all the sidecars'.
    pub per_grant: f64,
    /// Of those, the attempts sent again (a request unanswered for 500 ms: etcd overloaded).
    pub resent: f64,
    /// Acquires answered 503 (etcd did not answer in time) while the waiters queued, and sent
    /// again, as a client does.
    pub retried: usize,
}

/// `waiters` holder ids over `sidecars` queue for one lock behind a holder; then each one in
/// turn is granted and releases.
pub async fn long_queue(sidecars: &[Arc<Sidecar>], waiters: usize) -> LongQueue {
    let hot = lock(0);
    let first = &sidecars[0];
    first.must_acquire(&hot, json!({"holderId": "first"})).await;
    let retried = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..waiters)
        .map(|w| {
            let (s, hot, retried) = (sidecars[w % sidecars.len()].clone(), hot.clone(), retried.clone());
            tokio::spawn(async move {
                let holder = format!("waiter-{w}");
                let acquire = json!({"holderId": holder, "waitSeconds": 3600});
                for attempt in 1.. {
                    match s.post(&hot, "acquire", acquire.clone()).await {
                        (200, _) => break,
                        (503, _) if attempt < MAX_ATTEMPTS => retried.fetch_add(1, Ordering::Relaxed),
                        (status, body) => panic!("acquire {hot} on {}: {status} {body}", s.pod),
                    };
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                assert_eq!(s.post(&hot, "release", json!({"holderId": holder})).await.0, 200);
            })
        })
        .collect();
    let queued = wait_until(Duration::from_secs(600), || async {
        first.get(&format!("/v1/locks/{hot}")).await.1["waiters"] == waiters
    })
    .await;
    queued.expect("every waiter queued");
    let before = (
        requests(sidecars, "podlock_etcd_requests_total").await,
        requests(sidecars, "podlock_etcd_requests_resent_total").await,
    );
    assert_eq!(
        first.post(&hot, "release", json!({"holderId": "first"})).await.0,
        200
    );
    for t in tasks {
        t.await.unwrap();
    }
    let per_grant = |after: f64, before: f64| (after - before) / waiters as f64;
    LongQueue {
        per_grant: per_grant(requests(sidecars, "podlock_etcd_requests_total").await, before.0),
        resent: per_grant(
            requests(sidecars, "podlock_etcd_requests_resent_total").await,
            before.1,
        ),
        retried: retried.load(Ordering::Relaxed),
    }
}

async fn requests(sidecars: &[Arc<Sidecar>], metric: &str) -> f64 {
    let mut sum = 0.0;
    for s in sidecars {
        sum += s.metric(metric).await;
    }
    sum
}

/// One sidecar takes `holds` locks of its namespace at once; returns its RSS (MiB) then.
pub async fn many_holds(s: &Sidecar, holds: usize) -> f64 {
    for h in 0..holds {
        s.must_acquire(&lock(h), json!({"holderId": format!("many-{h}")}))
            .await;
    }
    crate::common::usage(s.pid()).0
}
