//! The operator's view of etcd: one watch over the settings and queues it manages that
//! (1) asks the controller to reconcile a lock whenever its keys change, so that status follows
//! etcd within a second without polling, and (2) keeps an index of queue entries by pod for the
//! pod-liveness check. A broken watch is re-established after a fresh read of every queue, and
//! every lock is reconciled again, so nothing that happened in between is missed; a key that
//! read brings back after it had ended marks its lock (see [`returned`](super::returned)).

use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::warn;

use super::noticed::Noticed;
use super::returned::{Known, Returned};
use super::verdict::{PodEntry, TakenBy};
use crate::crd::DistributedLock;
use crate::lock::{Change, LockError, LockId, QueueEntry, Store};
use crate::retry::{self, Pauses};

/// A pod, by namespace and name.
pub type PodKey = (String, String);

/// What a queue key-value says, read with trust in the key only.
#[derive(Debug)]
pub enum Parsed {
    /// An entry of the pod `(namespace of the key, pod name of the value)`.
    Entry(PodKey, PodEntry),
    /// Not bound to a pod (no uid: a sidecar outside Kubernetes), or not an entry.
    Unbound,
    /// An entry of a pod of another cluster sharing the lock etcd: its own operator judges it.
    OtherCluster,
    /// The value names a pod of another namespace than the key's: whoever wrote it could write
    /// only under the key's namespace, so it claims what it cannot own.
    Foreign {
        /// The lock of the key.
        lock: LockId,
        /// The holder id of the value.
        holder: String,
        /// The namespace the value claims.
        claimed: String,
    },
}

/// Reads a queue entry for the operator of `cluster`. The namespace comes from its key, which
/// etcd's per-namespace roles confine; the value is whatever its writer chose (a pod that
/// names another cluster than its own only forgoes its own operator's judgment: its lease still
/// ends its holds).
pub fn parse(queued: QueueEntry, cluster: &str) -> Parsed {
    let QueueEntry {
        lock,
        key,
        revision,
        lease,
        entry,
    } = queued;
    let Some(entry) = entry else {
        return Parsed::Unbound;
    };
    if entry.pod.uid.is_empty() {
        return Parsed::Unbound;
    }
    if entry.pod.cluster != cluster {
        return Parsed::OtherCluster;
    }
    if entry.pod.namespace != lock.namespace {
        return Parsed::Foreign {
            lock,
            holder: entry.holder_id,
            claimed: entry.pod.namespace,
        };
    }
    let Ok(requested) = humantime::parse_rfc3339_weak(&entry.requested_at) else {
        return Parsed::Unbound;
    };
    let pod = (lock.namespace.clone(), entry.pod.name);
    let e = PodEntry {
        lock,
        key,
        revision,
        lease,
        holder_id: entry.holder_id,
        uid: entry.pod.uid,
        requested,
        container: entry.container,
        bound: TakenBy::new(),
    };
    Parsed::Entry(pod, e)
}

/// Queue entries by pod, of the pods of one cluster.
pub struct PodIndex(Mutex<HashMap<PodKey, BTreeMap<String, PodEntry>>>, String);

impl PodIndex {
    /// An empty index of the entries of `cluster`'s pods.
    pub fn new(cluster: &str) -> Self {
        PodIndex(Mutex::default(), cluster.to_string())
    }

    /// The entries of one pod.
    pub fn entries_of(&self, pod: &PodKey) -> Vec<PodEntry> {
        self.0
            .lock()
            .unwrap()
            .get(pod)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every pod that has entries.
    pub fn pods(&self) -> Vec<PodKey> {
        self.0.lock().unwrap().keys().cloned().collect()
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    /// Records a queue key-value bound to a pod; returns its pod. Entries without a pod uid
    /// (sidecars outside Kubernetes) are not bound to any pod and are left out, and so are
    /// the entries of other clusters' pods and entries whose value names another namespace
    /// than their key (logged).
    fn put(&self, queued: QueueEntry) -> Option<PodKey> {
        let key = queued.key.clone();
        let (pod, mut e) = match parse(queued, &self.1) {
            Parsed::Entry(pod, e) => (pod, e),
            Parsed::Unbound | Parsed::OtherCluster => return None,
            Parsed::Foreign {
                lock,
                holder,
                claimed,
            } => {
                warn!(%lock, holder, claimed_namespace = claimed, key, "ignoring a queue entry that names a pod of another namespace than its key");
                return None;
            }
        };
        let mut map = self.0.lock().unwrap();
        let entries = map.entry(pod.clone()).or_default();
        // A rewrite of the same key (its `acquiredAt`) keeps what was learned about it.
        if let Some(old) = entries.get(&e.key)
            && old.revision == e.revision
        {
            e.bound = old.bound.clone();
        }
        entries.insert(e.key.clone(), e);
        Some(pod)
    }

    /// Remembers the incarnations bound to the entry `key` (of create revision `revision`).
    pub fn bind(&self, pod: &PodKey, key: &str, revision: i64, bound: &TakenBy) {
        let mut map = self.0.lock().unwrap();
        if let Some(e) = map.get_mut(pod).and_then(|m| m.get_mut(key))
            && e.revision == revision
        {
            e.bound = bound.clone();
        }
    }

    fn remove(&self, key: &str) {
        let mut map = self.0.lock().unwrap();
        map.retain(|_, entries| {
            entries.remove(key);
            !entries.is_empty()
        });
    }
}

/// What the etcd watch feeds the operator.
pub struct Feeds {
    /// The lock of every change, for the controller.
    pub changed: ReceiverStream<ObjectRef<DistributedLock>>,
    /// A tick whenever every lock must be reconciled.
    pub resync: ReceiverStream<()>,
    /// Pods that got a new queue entry, or all pods after a re-read.
    pub pods: mpsc::Receiver<PodKey>,
    /// Queue entries by pod.
    pub index: Arc<PodIndex>,
}

/// Watches the settings and queues of `namespace` (all when `None`): returns the feeds and the
/// future that fills them (it runs until dropped). The pod index has the pods of `cluster`.
/// Each change is marked in `noticed` (see [`Noticed`]), and each lock a restore brought keys
/// back to in `returned`.
pub fn watch(
    store: Store,
    namespace: Option<&str>,
    (noticed, returned): (Arc<Noticed>, Arc<Returned>),
    cluster: &str,
) -> (Feeds, impl Future<Output = ()> + use<>) {
    let namespace = namespace.map(str::to_string);
    let (changed, changed_rx) = mpsc::channel(1024);
    let (resync, resync_rx) = mpsc::channel(1);
    let (pods, pods_rx) = mpsc::channel(1024);
    let index = Arc::new(PodIndex::new(cluster));
    let feeds = Feeds {
        changed: ReceiverStream::new(changed_rx),
        resync: ReceiverStream::new(resync_rx),
        pods: pods_rx,
        index: index.clone(),
    };
    let pump = async move {
        let out = Outputs {
            index: &index,
            noticed: &noticed,
            returned: &returned,
            changed: &changed,
            resync: &resync,
            pods: &pods,
        };
        let mut pauses = Pauses::new(retry::rewatch());
        let mut known = Known::default();
        loop {
            if let Err(e) = follow(&store, namespace.as_deref(), &out, (&mut pauses, &mut known)).await {
                warn!(error = %e, "etcd watch broke; re-reading and re-watching");
            }
            if changed.is_closed() {
                return;
            }
            tokio::time::sleep(pauses.next_pause()).await;
        }
    };
    (feeds, pump)
}

/// Where [`follow`] puts what it learns.
struct Outputs<'a> {
    index: &'a PodIndex,
    noticed: &'a Noticed,
    returned: &'a Returned,
    changed: &'a mpsc::Sender<ObjectRef<DistributedLock>>,
    resync: &'a mpsc::Sender<()>,
    pods: &'a mpsc::Sender<PodKey>,
}

/// How often the locks whose keys changed are handed to the controller, each once. The
/// controller debounces a lock's reconciliation by 50 ms, and each new request for it pushes
/// one already scheduled back by as much: handed every event, a lock whose queue changed more
/// often than every 50 ms (a busy mutex hands over every few milliseconds) was not reconciled
/// until its queue paused. Its status lagged, and its deletion waited for the finalizer: the
/// safety run's "DistributedLock deleted and created again" once took 346 s of a 480 s run.
/// Handed at most once a period, a lock is reconciled within about one period plus 50 ms.
const COALESCE: Duration = Duration::from_millis(100);

/// Reads every queue, then follows changes until the watch breaks (or the controller is gone:
/// then `Ok`), keeping `known` up to date. A watch that opens starts a new run of `pauses`: only
/// failing again and again backs off further.
async fn follow(
    store: &Store,
    namespace: Option<&str>,
    out: &Outputs<'_>,
    (pauses, known): (&mut Pauses, &mut Known),
) -> Result<(), LockError> {
    let (entries, revision) = store.entries(namespace).await?;
    known.reread(&entries, revision, out.returned);
    out.index.clear();
    entries.into_iter().for_each(|e| drop(out.index.put(e)));
    let _ = out.resync.try_send(());
    for pod in out.index.pods() {
        let _ = out.pods.send(pod).await;
    }
    let mut changes = store.watch(namespace, revision + 1).await?;
    *pauses = Pauses::new(retry::rewatch());
    let mut changed = HashSet::new();
    let mut flush = tokio::time::interval(COALESCE);
    loop {
        let batch = tokio::select! {
            batch = changes.next() => batch?,
            _ = flush.tick() => {
                for object in changed.drain() {
                    if out.changed.send(object).await.is_err() {
                        return Ok(());
                    }
                }
                continue;
            }
        };
        let now = std::time::Instant::now();
        for change in batch {
            let lock = change.lock().clone();
            out.noticed.mark(&lock, now);
            match change {
                Change::Put(e) => {
                    known.put(&e);
                    if let Some(pod) = out.index.put(*e) {
                        let _ = out.pods.send(pod).await;
                    }
                }
                Change::Removed { key, .. } => {
                    known.remove(&key);
                    out.index.remove(&key);
                }
                Change::Settings(_) => {}
            }
            changed.insert(ObjectRef::new(&lock.name).within(&lock.namespace));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Entry;

    #[test]
    fn the_namespace_comes_from_the_key() {
        let value = |ns: &str| {
            serde_json::json!({"holderId": "h", "pod": {"namespace": ns, "name": "p", "uid": "u"},
                "requestedAt": "2026-01-01T00:00:00.250Z", "ttlSeconds": 15,
                "heartbeatTimeoutSeconds": 0, "container": "app"})
            .to_string()
        };
        let queued = |value: &[u8]| QueueEntry {
            lock: LockId::new("x", "l").unwrap(),
            key: "/podlock/v1/queue/x/l/00ff/h".into(),
            revision: 7,
            lease: 255,
            entry: Entry::decode(value),
        };
        match parse(queued(value("x").as_bytes()), "") {
            Parsed::Entry(pod, e) => {
                assert_eq!(pod, ("x".to_string(), "p".to_string()));
                assert_eq!(
                    (e.revision, e.lease, e.container.as_deref()),
                    (7, 255, Some("app"))
                );
            }
            other => panic!("{other:?}"),
        }
        match parse(queued(value("y").as_bytes()), "") {
            Parsed::Foreign { claimed, .. } => assert_eq!(claimed, "y"),
            other => panic!("a value naming another namespace was trusted: {other:?}"),
        }
        assert!(matches!(parse(queued(b"not json"), ""), Parsed::Unbound));
    }

    #[test]
    fn an_operator_judges_only_its_own_clusters_pods() {
        let value = |cluster: &str| {
            serde_json::json!({"holderId": "h",
                "pod": {"namespace": "x", "name": "p", "uid": "u", "cluster": cluster},
                "requestedAt": "2026-01-01T00:00:00.250Z", "ttlSeconds": 15,
                "heartbeatTimeoutSeconds": 0})
            .to_string()
        };
        let queued = |cluster: &str| QueueEntry {
            lock: LockId::new("x", "l").unwrap(),
            key: "/podlock/v1/queue/x/l/00ff/h".into(),
            revision: 7,
            lease: 255,
            entry: Entry::decode(value(cluster).as_bytes()),
        };
        assert!(matches!(parse(queued("east"), "east"), Parsed::Entry(..)));
        assert!(matches!(parse(queued("west"), "east"), Parsed::OtherCluster));
        assert!(matches!(parse(queued(""), "east"), Parsed::OtherCluster));
        assert!(matches!(parse(queued("west"), ""), Parsed::OtherCluster));
        let index = PodIndex::new("east");
        assert_eq!(index.put(queued("west")), None);
        assert_eq!(index.put(queued("east")), Some(("x".into(), "p".into())));
    }
}
