//! One seed's world: the simulated etcd, the operator (`operator.rs`) that declares the locks,
//! keeps them published and changes a semaphore's `maxHolders` underneath, sidecar engines
//! each on connections of its own, their clients, an observer (`observer.rs`), the waiter
//! liveness checker (`liveness.rs`) and the faults; then, once every client is done and all is
//! quiet, what must be left: no queue key and what `leftovers.rs` allows, and after the
//! sidecars stop, no lease.

use super::client::Client;
use super::net::Net;
use super::operator::{Operator, TTL};
use super::steps::{self, PodHandle};
use super::{LOCKS, NAMESPACE, World, faults, leftovers, liveness, observer, yields};
use crate::etcd::Etcd;
use crate::rng::Rng;
use podlock::lock::{DEADLINE, Engine, EventKind, PodRef, Store};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinHandle};
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
    /// The reader of its events.
    pub events: AbortHandle,
}

/// Runs `seed` to its end on the current (paused, single-threaded) runtime.
pub async fn run(seed: u64, world: &World, etcd: Arc<Etcd>) {
    let mut rng = Rng::new(seed);
    let store = Store::new(etcd.client().await);
    let steps_store = store.clone();
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
    let (clients, handles) = start_clients(&mut rng, world, (&pods, &peers), until);
    let nets: Vec<Net> = pods.iter().map(|p| p.net.clone()).collect();
    let faults = tokio::spawn(faults::run(rng.fork(), world.clone(), etcd.clone(), nets, until));
    let stop = until + WIND_DOWN + QUIET;
    steps::start(&mut rng, world, steps_store, handles, (until, stop));
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

/// Starts one to three clients on each of `pods` (`peers`: their engines, for fence checks
/// through any sidecar), acquiring until `until`; returns their tasks, and each pod's handle
/// for the steps that stop or cut off a pod.
fn start_clients(
    rng: &mut Rng,
    world: &World,
    (pods, peers): (&[Pod], &[Engine]),
    until: Instant,
) -> (Vec<JoinHandle<()>>, Vec<PodHandle>) {
    let (mut clients, mut handles) = (Vec::new(), Vec::new());
    for (p, pod) in pods.iter().enumerate() {
        let mut tasks = vec![pod.events.clone()];
        for c in 0..rng.between(1, 3) {
            let client = Client {
                id: format!("p{p}c{c}"),
                engine: pod.engine.clone(),
                peers: peers.to_vec(),
                rng: rng.fork(),
                world: world.clone(),
            };
            let task = tokio::spawn(client.run(until));
            tasks.push(task.abort_handle());
            clients.push(task);
        }
        handles.push(PodHandle {
            net: pod.net.clone(),
            tasks,
        });
    }
    (clients, handles)
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
    let (mut events, world, own) = (engine.subscribe(None), world.clone(), engine.clone());
    let events = tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            if e.kind == EventKind::Yield {
                yields::heard(&own, &world, e);
            } else if e.kind == EventKind::Lost {
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
    let events = events.abort_handle();
    Pod { engine, net, events }
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
    // A dead pod's engine reaches nothing: the operator revoked its leases.
    let dead = world.with(|s| s.ops.dead.clone());
    for (_, p) in pods.iter().enumerate().filter(|(i, _)| !dead.contains(i)) {
        p.engine.shutdown().await;
    }
    sleep(Duration::from_secs(TTL.into())).await;
    // A release note (a forced end's, `txn/release_note.rs`) lives on a lease of its own that
    // ends a minute later, longer than a TTL.
    let note = |ttl: i64, keys: &BTreeSet<Vec<u8>>| {
        ttl > i64::from(TTL) && keys.iter().all(|k| k.windows(11).any(|w| w == b"/.released/"))
    };
    let leases: Vec<i64> = etcd.inspect(|s| {
        (s.leases.ids())
            .filter(|id| !s.leases.get(*id).is_some_and(|l| note(l.ttl, &l.keys)))
            .collect()
    });
    if !leases.is_empty() {
        world.fail(format!("leases left after every sidecar stopped: {leases:x?}"));
    }
    world.with(|s| s.check.checks += 2);
    leftovers::stopped(world, etcd, pods).await;
}
