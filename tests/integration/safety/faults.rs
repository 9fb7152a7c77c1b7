//! The fault loop: one fault at a time, the next only once a hold granted after the previous
//! fault has written, so that the time each fault cost is measured on its own.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::sleep;

use super::worker::{STALL, Slot};
use super::{TTL, now};
use crate::common::{EtcdServer, Sidecar, declare, wait_until};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// kill -9 of a sidecar (the lock holder's when there is one), then a new one for its pod.
    SidecarKill,
    /// A holder stalls past the TTL between its grant and its write, and its sidecar is
    /// stopped (SIGSTOP, keepalives included) for the TTL plus 1 s, then continued.
    Pause,
    /// kill -9 of an etcd follower, restarted 1 s later.
    FollowerKill,
    /// kill -9 of the etcd leader, restarted 1 s later.
    LeaderKill,
    /// A holder's sidecar is stopped just before the worker sends its release, for the TTL plus
    /// 1 s: the release arrives after another worker was granted, and must not be answered
    /// `released`.
    ReleasePause,
    /// A holder stalls past its heartbeat window between grant and write, its sidecar running:
    /// the sidecar ends the hold at the window.
    WorkerStall,
    /// The lock deleted (every key with it) and declared again at once.
    LockDeleted,
    /// SIGSTOP of an etcd follower for the TTL plus 1 s: its connections stay open and silent.
    FollowerStall,
    /// SIGSTOP of the etcd leader for the TTL plus 1 s.
    LeaderStall,
    /// The lock's settings written again (same values, new mod revision): every queued waiter
    /// reads them again and every enqueue in flight retries.
    SettingsRewrite,
}

impl Kind {
    /// Every kind, in the order the loop injects them.
    pub const CYCLE: [Kind; 10] = [
        Kind::LeaderKill,
        Kind::SidecarKill,
        Kind::FollowerStall,
        Kind::FollowerKill,
        Kind::SettingsRewrite,
        Kind::Pause,
        Kind::LeaderStall,
        Kind::ReleasePause,
        Kind::WorkerStall,
        Kind::LockDeleted,
    ];

    /// How soon after it a newly granted hold must have written: the TTL plus 1 s. A stalled
    /// leader costs one more second: no lease can be kept alive until the others elect a new
    /// leader (etcd's election timeout is 1 s), so with a 2 s TTL the holds whose last
    /// keepalive came early are lost, and their successors need new leases from the new leader.
    pub fn recovery_limit(self) -> Duration {
        let election = if self == Kind::LeaderStall { 1 } else { 0 };
        TTL + Duration::from_secs(1 + election)
    }

    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::SidecarKill => "sidecar kill -9 + restart",
            Kind::Pause => "pause past the TTL",
            Kind::FollowerKill => "etcd follower kill -9 + restart",
            Kind::LeaderKill => "etcd leader kill -9 + restart",
            Kind::FollowerStall => "etcd follower SIGSTOP past the TTL",
            Kind::LeaderStall => "etcd leader SIGSTOP past the TTL",
            Kind::SettingsRewrite => "lock settings rewritten",
            Kind::ReleasePause => "pause past the TTL before release",
            Kind::WorkerStall => "holder stalled past its heartbeat",
            Kind::LockDeleted => "lock deleted and declared again",
        }
    }
}

/// One injected fault. Times are wall-clock seconds since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// What was done.
    pub kind: Kind,
    /// To which worker's sidecar (pauses and kills) or etcd member.
    pub target: usize,
    /// When: the kill or the SIGSTOP.
    pub at: f64,
    /// When the victim ran again (SIGCONT, or the restarted member serving).
    pub until: f64,
}

/// The processes under test.
pub struct Rig {
    /// The etcd members.
    pub etcd: Vec<EtcdServer>,
    /// Their client URLs, comma-separated, as the sidecars get them.
    pub endpoints: String,
    /// Sidecar `i` serves worker `i`.
    pub sidecars: Vec<Sidecar>,
    /// The workers' slots.
    pub slots: Vec<Arc<Slot>>,
}

impl Rig {
    /// The index of the etcd leader, if a member says it is.
    async fn leader(&self) -> Option<usize> {
        for (i, m) in self.etcd.iter().enumerate() {
            if m.is_leader().await {
                return Some(i);
            }
        }
        None
    }

    /// The worker whose sidecar holds the lock now, if any.
    async fn holder(&self) -> Option<usize> {
        let (_, info) = self.sidecars[0].get("/v1/locks/counter").await;
        let pod = info["holders"][0]["pod"].as_str()?;
        self.slots.iter().position(|s| s.pod == pod)
    }

    /// Whether a hold granted after `t` has had its write accepted.
    fn progressed_since(&self, t: f64) -> bool {
        self.slots.iter().any(|s| {
            s.holds
                .lock()
                .unwrap()
                .iter()
                .any(|h| h.granted > t && h.write.is_some_and(|w| w.status == 200))
        })
    }

    /// Injects one fault of `kind` (`round` picks among victims); `None` if there was no
    /// victim to be had.
    async fn inject(&mut self, kind: Kind, round: usize) -> Option<Fault> {
        let n = self.slots.len();
        match kind {
            Kind::SidecarKill => {
                let i = self.holder().await.unwrap_or(round % n);
                let at = now();
                self.sidecars[i].kill9();
                let pod = self.slots[i].pod.clone();
                self.sidecars[i] = Sidecar::start(&self.endpoints, &pod, &[]).await;
                *self.slots[i].addr.lock().unwrap() = self.sidecars[i].addr.clone();
                Some(Fault {
                    kind,
                    target: i,
                    at,
                    until: now(),
                })
            }
            Kind::Pause | Kind::ReleasePause | Kind::WorkerStall => {
                let i = round % n;
                let slot = &self.slots[i];
                let flag = if kind == Kind::ReleasePause {
                    &slot.stall_release
                } else {
                    &slot.stall
                };
                flag.store(true, Ordering::Relaxed);
                let stalling = wait_until(Duration::from_secs(10), || async {
                    slot.stalling.load(Ordering::Relaxed)
                })
                .await;
                if stalling.is_err() {
                    flag.store(false, Ordering::Relaxed);
                    return None;
                }
                let at = now();
                if kind == Kind::WorkerStall {
                    sleep(STALL).await; // only the worker stalls; its sidecar runs on
                } else {
                    self.sidecars[i].signal(libc::SIGSTOP);
                    sleep(TTL + Duration::from_secs(1)).await;
                    self.sidecars[i].signal(libc::SIGCONT);
                }
                Some(Fault {
                    kind,
                    target: i,
                    at,
                    until: now(),
                })
            }
            Kind::FollowerKill | Kind::LeaderKill | Kind::FollowerStall | Kind::LeaderStall => {
                let leader = self.leader().await?;
                let victim = if matches!(kind, Kind::LeaderKill | Kind::LeaderStall) {
                    leader
                } else {
                    (leader + 1 + round % 2) % self.etcd.len()
                };
                let at = now();
                if matches!(kind, Kind::FollowerStall | Kind::LeaderStall) {
                    self.etcd[victim].signal(libc::SIGSTOP);
                    sleep(TTL + Duration::from_secs(1)).await;
                    self.etcd[victim].signal(libc::SIGCONT);
                } else {
                    self.etcd[victim].stop();
                    sleep(Duration::from_secs(1)).await;
                    self.etcd[victim].resume().await;
                }
                Some(Fault {
                    kind,
                    target: victim,
                    at,
                    until: now(),
                })
            }
            Kind::SettingsRewrite | Kind::LockDeleted => {
                let at = now();
                if kind == Kind::LockDeleted {
                    declare(&self.endpoints, &["counter", "--delete"]);
                }
                let ttl = TTL.as_secs().to_string();
                declare(&self.endpoints, &["counter", "--ttl-seconds", &ttl]);
                Some(Fault {
                    kind,
                    target: 0,
                    at,
                    until: now(),
                })
            }
        }
    }
}

/// Injects faults for `seconds`, and at least two of each kind, each after half a second of
/// normal work and only once the lock made progress after the previous one.
pub async fn run(rig: &mut Rig, seconds: f64) -> Vec<Fault> {
    let start = now();
    let mut faults = vec![];
    let mut round = 0;
    while now() - start < seconds || round < 2 * Kind::CYCLE.len() {
        sleep(Duration::from_millis(500)).await;
        let kind = Kind::CYCLE[round % Kind::CYCLE.len()];
        round += 1;
        let Some(fault) = rig.inject(kind, round).await else {
            continue;
        };
        faults.push(fault);
        // The checker reports a fault after which progress did not resume.
        let _ = wait_until(Duration::from_secs(20), || async {
            rig.progressed_since(fault.at)
        })
        .await;
    }
    faults
}
