//! What a status write costs the API server, written two ways: a server-side apply of the whole
//! status (what the operator did before) and a JSON merge patch that removes every field left
//! out (`DistributedLockStatus::merge_patch`, what it does now). Run before the operator starts,
//! on locks of a namespace of their own: the same statuses, the same number of writes, the same
//! concurrency as the operator's status writer, each way in turn.

use futures::StreamExt;
use kube::Api;
use kube::api::{Patch, PatchParams};
use podlock::crd::{Condition, DistributedLock, DistributedLockStatus, Holder};
use serde_json::json;
use std::time::{Duration, Instant};

use crate::Row;
use crate::common::kube::ControlPlane;
use crate::common::percentile;
use crate::cpu::by_name;
use crate::fleet;

/// The namespace of the locks written.
const NAMESPACE: &str = "scale-status-writes";
/// Writes under way at once: the operator's status writers.
const WRITERS: usize = 8;

/// A way to write a status.
#[derive(Clone, Copy)]
enum Way {
    Apply,
    Merge,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Apply => "server-side apply",
            Way::Merge => "merge patch",
        }
    }
}

/// Writes `writes` statuses over `locks` locks each way; the rows that compare them.
pub async fn compare(plane: &ControlPlane, locks: usize, writes: usize) -> Vec<Row> {
    let ns = plane.namespace(NAMESPACE);
    fleet::create_in(plane, &ns, locks);
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    let mut rows = vec![];
    for way in [Way::Apply, Way::Merge] {
        rows.push(measure(&api, way, locks, writes).await);
    }
    let object = api.get(&fleet::lock(0)).await.expect("a lock written");
    let bytes = serde_json::to_vec(&object).expect("an object serializes").len();
    let managed = object.metadata.managed_fields.unwrap_or_default().len();
    rows.push(Row(
        "a status object written both ways: JSON, managed fields entries".into(),
        format!("{bytes} bytes, {managed} entries"),
        "",
    ));
    // Gone before the operator starts: it would reconcile them as part of the fleet.
    let (ok, _, err) = plane.kubectl(&["delete", "namespace", &ns, "--wait=true"]);
    assert!(ok, "deleting {ns}: {err}");
    rows
}

/// Writes `writes` statuses `way`, `WRITERS` at a time; the row of its cost.
async fn measure(api: &Api<DistributedLock>, way: Way, locks: usize, writes: usize) -> Row {
    let before = (by_name("kube-apiserver"), by_name("etcd"));
    let started = Instant::now();
    let mut took: Vec<Duration> = futures::stream::iter(0..writes)
        .map(|i| write(api, way, i % locks, i))
        .buffer_unordered(WRITERS)
        .collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    let api_cpu = (by_name("kube-apiserver") - before.0) / writes as f64 * 1000.0;
    let etcd_cpu = (by_name("etcd") - before.1) / writes as f64 * 1000.0;
    let mean = took.iter().sum::<Duration>().as_secs_f64() / writes as f64 * 1000.0;
    let p99 = percentile(&mut took, 0.99).as_secs_f64() * 1000.0;
    Row(
        format!(
            "status write by {}, {writes} writes over {locks} locks, {WRITERS} at a time",
            way.name()
        ),
        format!(
            "API server CPU {api_cpu:.2} ms per write, etcd {etcd_cpu:.2} ms; PATCH mean {mean:.0} ms, p99 {p99:.0} ms; {:.0} writes/s",
            writes as f64 / secs
        ),
        "",
    )
}

/// Writes lock `l`'s `i`th status `way`; how long the PATCH took.
async fn write(api: &Api<DistributedLock>, way: Way, l: usize, i: usize) -> Duration {
    let status = status(i);
    let started = Instant::now();
    let name = fleet::lock(l);
    let result = match way {
        Way::Apply => {
            let body =
                json!({"apiVersion": "podlock.io/v1alpha1", "kind": "DistributedLock", "status": status});
            let params = PatchParams::apply("podlock-operator").force();
            api.patch_status(&name, &params, &Patch::Apply(&body)).await
        }
        Way::Merge => {
            let params = PatchParams::default();
            api.patch_status(&name, &params, &Patch::Merge(&status.merge_patch()))
                .await
        }
    };
    result.unwrap_or_else(|e| panic!("status write by {}: {e}", way.name()));
    started.elapsed()
}

/// A status as the operator writes it for a busy mutex: one holder (a new one each write),
/// waiters, the fencing fields and the Ready condition.
fn status(i: usize) -> DistributedLockStatus {
    let token = 1_000 + i as i64;
    DistributedLockStatus {
        phase: Some("Held".into()),
        holders: vec![Holder {
            holder_id: format!("client-{}", i % 5),
            pod: format!("worker-{}", i % 2),
            cluster: None,
            fencing_token: token,
            acquired_at: "2026-11-28T10:00:00.123Z".into(),
            mode: "exclusive".into(),
            yield_deadline: None,
            permits: 1,
        }],
        holder_count: 1,
        waiters: (i % 5) as u32,
        fencing_token: Some(token),
        fencing_epoch: Some(0),
        observed_generation: Some(1),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Published".into(),
            message: "the lock's settings are live in etcd (maxHolders 1, ttlSeconds 30)".into(),
            last_transition_time: "2026-11-28T09:59:00.000Z".into(),
            observed_generation: Some(1),
        }],
        holder_service: None,
    }
}
