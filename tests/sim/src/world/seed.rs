//! One seed's world: the simulated etcd, the operator (`operator.rs`) that declares the locks,
//! keeps them published and changes a semaphore's `maxHolders` underneath, sidecar engines
//! each on connections of its own, their clients, an observer (`observer.rs`), the waiter
//! liveness checker (`liveness.rs`) and the faults; then, once every client is done and all is
//! quiet, what must be left: no queue key and what `leftovers.rs` allows, and after the
//! sidecars stop, no lease.

use super::client::Client;
use super::net::Net;
use super::operator::{Operator, TTL};
use super::{LOCKS, NAMESPACE, World, faults, leftovers, liveness, observer};
use crate::etcd::Etcd;
use crate::rng::Rng;
use podlock::lock::{DEADLINE, Engine, EventKind, PodRef, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

/// How long clients keep acquiring.
const ACTIVE: Duration = Duration::from_secs(30);
/// How long a client may take to finish its last hold once `ACTIVE` is over.
const WIND_DOWN: Duration = Duration::from_secs(60);
/// How long after the last client the world waits before looking for what is left: longer
/// than a lease's TTL, a removal's retries and the orphan sweep's two rounds.
const QUIET: Duration = Duration::from_secs(20);

/// A sidecar: its engine and its network.
pub struct Pod {
    /// The engine, as `podlock sidecar` starts it.
    pub engine: Engine,
    /// Its connections to etcd.
    pub net: Net,
}

/// Runs `seed` to its end on the current (paused, single-threaded) runtime.
pub async fn run(seed: u64, world: &World, etcd: Arc<Etcd>) {
    let mut rng = Rng::new(seed);
    let store = Store::new(etcd.client().await);
    let mut operator = Operator::new(rng.fork(), world.clone(), store);
    for (i, l) in LOCKS.iter().enumerate() {
        if let Err(e) = operator.reconcile(i).await {
            return world.fail(format!("declare {}: {e}", l.name));
        }
    }
    let mut pods = Vec::new();
    for p in 0..rng.between(2, 4) {
        pods.push(start_pod(p, &etcd, world).await);
    }
    let until = Instant::now() + ACTIVE;
    let peers: Vec<Engine> = pods.iter().map(|p| p.engine.clone()).collect();
    let mut clients = Vec::new();
    for (p, pod) in pods.iter().enumerate() {
        for c in 0..rng.between(1, 3) {
            let client = Client {
                id: format!("p{p}c{c}"),
                engine: pod.engine.clone(),
                peers: peers.clone(),
                rng: rng.fork(),
                world: world.clone(),
            };
            clients.push(tokio::spawn(client.run(until)));
        }
    }
    let nets: Vec<Net> = pods.iter().map(|p| p.net.clone()).collect();
    let faults = tokio::spawn(faults::run(rng.fork(), world.clone(), etcd.clone(), nets, until));
    let operator = tokio::spawn(operator.run(until));
    let (live, observer) = (oneshot::channel(), oneshot::channel());
    let live_task = tokio::spawn(liveness::run(world.clone(), etcd.clone(), live.1));
    let observer_task = tokio::spawn(observer::run(rng.fork(), world.clone(), peers, observer.1));
    for c in clients {
        if timeout(ACTIVE + WIND_DOWN, c).await.is_err() {
            world.fail("a client was still acquiring or holding long after the end".into());
        }
    }
    let _ = (live.0.send(()), faults.await, operator.await, live_task.await);
    sleep(QUIET).await;
    let _ = (observer.0.send(()), observer_task.await);
    left_over(world, &etcd, &pods).await;
}

pub(super) async fn start_pod(p: u64, etcd: &Arc<Etcd>, world: &World) -> Pod {
    let net = Net::default();
    let channel = etcd_client::Channel::Tonic(net.channel(etcd));
    let client = (etcd_client::Client::from_channel(channel, None).await).expect("no auth: nothing to fail");
    let pod = PodRef {
        namespace: NAMESPACE.into(),
        name: format!("pod-{p}"),
        uid: String::new(),
        cluster: String::new(),
    };
    let engine = Engine::new(client, Vec::new(), pod, false);
    let (mut events, world) = (engine.subscribe(None), world.clone());
    tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            if e.kind == EventKind::Lost {
                let why = e.reason.unwrap_or_default();
                world.log(format!(
                    "{} lost {} token {}: {why}",
                    e.holder_id, e.lock.name, e.fencing_token
                ));
                world.released(&e.holder_id, &e.lock.name, e.fencing_token);
                if why == DEADLINE {
                    world.with(|s| s.deadline_ends.insert((e.lock.name, e.fencing_token)));
                }
            }
        }
    });
    Pod { engine, net }
}

/// What must be gone once all is quiet: every queue key (a release's receipt lives on its
/// lease); then, once the sidecars stopped, every lease.
async fn left_over(world: &World, etcd: &Etcd, pods: &[Pod]) {
    let prefix = format!("{}{NAMESPACE}/", super::check::QUEUE_PREFIX);
    let keys: Vec<String> = etcd.inspect(|s| {
        (s.keys_under(prefix.as_bytes()).iter())
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .filter(|k| !k.contains("/.released/"))
            .collect()
    });
    if !keys.is_empty() {
        world.fail(format!("queue keys left once all was quiet: {keys:?}"));
    }
    leftovers::quiet(world, pods).await;
    for p in pods {
        p.engine.shutdown().await;
    }
    sleep(Duration::from_secs(TTL.into())).await;
    let leases: Vec<i64> = etcd.inspect(|s| s.leases.ids().collect());
    if !leases.is_empty() {
        world.fail(format!("leases left after every sidecar stopped: {leases:x?}"));
    }
    world.with(|s| s.check.checks += 2);
    leftovers::stopped(world, etcd, pods).await;
}
