//! Whether a queue entry must end given its pod as the API server reports it: pure rules, so
//! that they can be checked on their own.
//!
//! Container restarts are judged by incarnation, not by the kubelet's whole-second timestamps.
//! A hold records only what the app knows: when it asked (`requestedAt`, milliseconds) and,
//! optionally, the name of its container (`PODLOCK_CONTAINER`, set by the injector). The
//! operator then *binds* the hold to the incarnation of each judged container that was
//! running at the request: one that is running now and started in an earlier second than the
//! request was running at the request (a container has one incarnation at a time), so it took
//! the hold. It remembers that incarnation's `restartCount` and `containerID`; any later
//! incarnation (a higher restart count) or that incarnation's end means the holder is gone,
//! even within the same second. Without a binding, an incarnation that started (or ended) in a
//! later second than the request is also proof; the rest (same second, not running) is left
//! alone until a later status says more.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::lock::LockId;
use crate::operator::inject::SIDECAR_CONTAINER;

/// One queue entry (hold or wait) of a pod.
#[derive(Debug, Clone)]
pub struct PodEntry {
    /// The lock.
    pub lock: LockId,
    /// The queue key.
    pub key: String,
    /// Its create revision (the fencing token once held).
    pub revision: i64,
    /// The lease etcd has the key on (not what its name or value says).
    pub lease: i64,
    /// The holder id.
    pub holder_id: String,
    /// The pod uid the sidecar was started with.
    pub uid: String,
    /// When the acquire was requested.
    pub requested: SystemTime,
    /// The app container that asked, when the app named it.
    pub container: Option<String>,
    /// The container incarnations proven to have taken it (see [`verdict`]).
    pub bound: TakenBy,
}

/// Why the operator ended a hold (the `reason` label of `podlock_forced_releases_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The Pod object was deleted.
    PodDeleted,
    /// The pod reached phase `Failed`.
    PodFailed,
    /// The pod reached phase `Succeeded`.
    PodSucceeded,
    /// A pod of the same name now has another uid.
    PodReplaced,
    /// The container incarnation that took the hold is gone.
    ContainerRestarted,
    /// The sidecar incarnation that kept the hold's lease alive is gone (a crash, an OOM
    /// kill): a new sidecar cannot continue its session, so the hold would last its TTL.
    SidecarRestarted,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 6] = [
        Reason::PodDeleted,
        Reason::PodFailed,
        Reason::PodSucceeded,
        Reason::PodReplaced,
        Reason::ContainerRestarted,
        Reason::SidecarRestarted,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::PodDeleted => "pod_deleted",
            Reason::PodFailed => "pod_failed",
            Reason::PodSucceeded => "pod_succeeded",
            Reason::PodReplaced => "pod_replaced",
            Reason::ContainerRestarted => "container_restarted",
            Reason::SidecarRestarted => "sidecar_restarted",
        }
    }

    /// Whether the hold's sidecar session is gone with it (the whole pod, or the sidecar
    /// incarnation that kept it): then its leases may be revoked too.
    pub fn whole_pod(self) -> bool {
        self != Reason::ContainerRestarted
    }
}

/// One run of a container: its restart count and runtime id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    /// `restartCount` while it ran (only ever grows for a container of a pod).
    pub restarts: i32,
    /// `containerID` (empty when the kubelet has not reported one).
    pub id: String,
}

/// The incarnation that took a hold, by container name: what a hold is bound to in its pod.
pub type TakenBy = BTreeMap<String, Incarnation>;

/// Why `entry` must end given `pod`, if it must; records in `bound` the incarnations that are
/// proven to have taken the hold.
pub fn verdict(pod: &Pod, entry: &PodEntry, bound: &mut TakenBy) -> Option<Reason> {
    if pod.metadata.uid.as_deref() != Some(entry.uid.as_str()) {
        return Some(Reason::PodReplaced);
    }
    let status = pod.status.as_ref()?;
    match status.phase.as_deref() {
        Some("Failed") => return Some(Reason::PodFailed),
        Some("Succeeded") => return Some(Reason::PodSucceeded),
        _ => {}
    }
    // A hold that names its container is judged by that container alone (an init container
    // too: one that ran to completion without releasing is gone); one that names none by every
    // app container of the pod (the behaviour before holds could name one).
    if sidecar_gone(status, entry, bound) {
        return Some(Reason::SidecarRestarted);
    }
    let init = status.init_container_statuses.iter().flatten();
    let judged = status
        .container_statuses
        .iter()
        .flatten()
        .chain(init.filter(|_| entry.container.is_some()))
        .filter(|c| match &entry.container {
            Some(name) => c.name == *name,
            // Not one whose first incarnation started after the request: it never asked.
            None => c.name != SIDECAR_CONTAINER && !first_started_after(c, entry.requested),
        });
    let mut gone = false;
    for c in judged {
        let mut own = bound.get(&c.name).cloned();
        gone |= container_gone(c, entry.requested, &mut own);
        if let Some(inc) = own {
            bound.insert(c.name.clone(), inc);
        }
    }
    gone.then_some(Reason::ContainerRestarted)
}

/// Whether the sidecar incarnation that was running at the request (and so wrote the entry
/// and keeps its lease alive) is gone. A native sidecar reports among the init containers, one
/// written by hand may be an app container.
fn sidecar_gone(status: &PodStatus, entry: &PodEntry, bound: &mut TakenBy) -> bool {
    let all = status
        .init_container_statuses
        .iter()
        .chain(&status.container_statuses);
    let Some(c) = all.flatten().find(|c| c.name == SIDECAR_CONTAINER) else {
        return false;
    };
    let mut own = bound.get(&c.name).cloned();
    let gone = container_gone(c, entry.requested, &mut own);
    if let Some(inc) = own {
        bound.insert(c.name.clone(), inc);
    }
    gone
}

/// Whether the incarnation of `c` that was running at `requested` is gone; binds `bound` to it
/// when this status proves which one it was.
pub fn container_gone(c: &ContainerStatus, requested: SystemTime, bound: &mut Option<Incarnation>) -> bool {
    use k8s_openapi::api::core::v1::ContainerStateTerminated as Terminated;
    let state = c.state.as_ref();
    let running = state.and_then(|s| s.running.as_ref());
    let terminated = state.and_then(|s| s.terminated.as_ref());
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let id = c.container_id.clone().unwrap_or_default();
    if let Some(inc) = bound {
        // A later incarnation, or the end of the bound one. A status older than the binding (a
        // lagging cache) shows a lower count, or the bound incarnation still running: no proof.
        let is_bound =
            |t: Option<&Terminated>| t.is_some_and(|t| t.container_id.clone().unwrap_or_default() == inc.id);
        let replaced = running.is_some() && !id.is_empty() && !inc.id.is_empty() && id != inc.id;
        let waiting = state.is_some_and(|s| s.waiting.is_some());
        if c.restart_count > inc.restarts
            || c.restart_count == inc.restarts
                && (is_bound(terminated) || waiting && is_bound(last) || replaced)
        {
            return true;
        }
        // The kubelet may report the id only after the start: learn it at the same count.
        if inc.id.is_empty() && running.is_some() && c.restart_count == inc.restarts {
            inc.id = id.clone();
        }
    }
    // An incarnation that started, or ended, in a later second than the request proves the
    // one that asked gone (one incarnation at a time), bound or not.
    let started = running.and_then(|r| r.started_at.as_ref());
    if after(started, requested) || after(finished(terminated), requested) || after(finished(last), requested)
    {
        return true;
    }
    if bound.is_none() && running.is_some() && before(started, requested) {
        *bound = Some(Incarnation {
            restarts: c.restart_count,
            id,
        });
    }
    false
}

/// Whether `c` never restarted and its one incarnation started after `requested`: a pod's app
/// containers start one after another, so a hold one of them asked for can come before the
/// next one starts, which proves nothing of it.
fn first_started_after(c: &ContainerStatus, requested: SystemTime) -> bool {
    let state = c.state.as_ref();
    let started = (state
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref()))
    .or_else(|| (state.and_then(|s| s.terminated.as_ref())).and_then(|t| t.started_at.as_ref()));
    c.restart_count == 0 && after(started, requested)
}

/// When a terminated incarnation finished.
fn finished(t: Option<&k8s_openapi::api::core::v1::ContainerStateTerminated>) -> Option<&Time> {
    t.and_then(|t| t.finished_at.as_ref())
}

/// Seconds since the epoch, as the kubelet reports them (truncated).
fn secs(t: &Time) -> u64 {
    SystemTime::from(t.0)
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `t` (whole seconds) is surely before `requested`: its whole second ended by then.
fn before(t: Option<&Time>, requested: SystemTime) -> bool {
    let r = requested
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    t.is_some_and(|t| u128::from(secs(t) + 1) * 1000 <= r.as_millis())
}

/// `t` (whole seconds) is surely after `requested`: its second began after it.
fn after(t: Option<&Time>, requested: SystemTime) -> bool {
    let r = requested
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    t.is_some_and(|t| u128::from(secs(t)) * 1000 > r.as_millis())
}

#[cfg(test)]
#[path = "verdict_tests.rs"]
mod tests;
