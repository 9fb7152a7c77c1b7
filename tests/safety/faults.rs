//! The fault loop: one fault at a time, the next only once a hold granted after the previous
//! fault has written, so that the time each fault cost is measured on its own.

use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::sleep;

use super::objects::{NAMESPACE, recreate_lock};
use super::rig::Rig;
use super::worker::STALL;
use super::{COUNTER, POOL, POOL_LOWERED, POOL_SLOTS, TTL, now};
use crate::common::{declare, wait_until};
use tokio::task::block_in_place;

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
    /// The DistributedLock deleted in both clusters (each operator withdraws: ends its own
    /// pods' keys; the lock leaves etcd with the last) and created again.
    LockDeleted,
    /// The mutex holder's Pod deleted while its sidecar runs on, unaware: the operator ends
    /// its holds. Then the pod comes back under its name with a new uid and a new sidecar.
    PodDeleted,
    /// SIGSTOP of an etcd follower for the TTL plus 1 s: its connections stay open and silent.
    FollowerStall,
    /// SIGSTOP of the etcd leader for the TTL plus 1 s.
    LeaderStall,
    /// An etcd follower cut off from its peers and every client for the TTL plus 1 s (every
    /// packet of its network namespace's link dropped), then joined again.
    FollowerPartition,
    /// The etcd leader cut off for the TTL plus 1 s: the others elect a new one while it
    /// still believes it leads.
    LeaderPartition,
    /// The lock's settings written again (same values, new mod revision): every queued waiter
    /// reads them again and every enqueue in flight retries.
    SettingsRewrite,
    /// The semaphore's `maxHolders` lowered (2 to 1) on its DistributedLock while it is full
    /// and waiters queue: its holders stay, and no one is granted until they are fewer than one.
    PoolLowered,
    /// The semaphore's `maxHolders` raised back (1 to 2) while waiters queue: the first waiter
    /// is let in beside the holder, in queue order.
    PoolRaised,
    /// An administrator's force release of the mutex (`kubectl annotate dlock counter
    /// podlock.io/release=HOLDER` while that holder is stalled between its grant and its write,
    /// as a hung app would be; or `=*` every other time, on whoever holds): the operator ends
    /// the hold, its client is told `lost`, the next waiter is granted, and a stalled holder's
    /// late write is rejected by fencing.
    ForceRelease,
    /// An administrator asks the mutex's holder to yield within 1 s (`kubectl annotate dlock
    /// counter podlock.io/yield=HOLDER podlock.io/yield-grace=1s`, while that holder is stalled
    /// between its grant and its write; or `=*` every other time, on whoever holds): a stalled
    /// holder that heeds its `yield` event writes and releases in time; one that does not (a
    /// hung app) is ended at the deadline, told `lost` with reason `yield`, and its late write
    /// is rejected by fencing.
    YieldAsked,
    /// The next request on the mutex's queue (an enqueue, a grant's record, a release) is
    /// applied by its member at once, but that member answers everything 1.5 s late for the
    /// next 1.5 s: the sidecar sends it again to another member after 500 ms (the hedge), whose
    /// copy finds the first copy's work done (a release answers by its receipt).
    LateAnswers,
    /// etcd restored from a snapshot taken 1.5 s before, with `--bump-revision` and
    /// `--mark-compacted`, every member at once: holds released since come back, and the
    /// operator moves the lock to a new epoch ([`rebuild`](super::rebuild)).
    Restored,
    /// etcd wiped, every member at once; once the operator has published the lock again (under
    /// a new epoch), its DistributedLock deleted and created again ([`rebuild`](super::rebuild)).
    Wiped,
}

/// How late a member answers after [`Kind::LateAnswers`].
pub const LATE: Duration = Duration::from_millis(1500);

impl Kind {
    /// Every kind, in the order the loop injects them.
    pub const CYCLE: [Kind; 20] = [
        Kind::LeaderKill,
        Kind::SidecarKill,
        Kind::PoolLowered,
        Kind::FollowerStall,
        Kind::FollowerKill,
        Kind::SettingsRewrite,
        Kind::LeaderPartition,
        Kind::Pause,
        Kind::PoolRaised,
        Kind::LeaderStall,
        Kind::ReleasePause,
        Kind::FollowerPartition,
        Kind::WorkerStall,
        Kind::PodDeleted,
        Kind::ForceRelease,
        Kind::LockDeleted,
        Kind::YieldAsked,
        Kind::Restored,
        Kind::LateAnswers,
        Kind::Wiped,
    ];

    /// How soon after it a newly granted hold must have written: the TTL plus 1 s. A stalled
    /// leader costs one more second: no lease can be kept alive until the others elect a new
    /// leader (etcd's election timeout is 1 s), so with a 2 s TTL the holds whose last
    /// keepalive came early are lost, and their successors need new leases from the new leader.
    /// A partitioned leader costs the same, and so does a killed one: its followers learn of
    /// its loss by missed heartbeats too, not by its closed connections (the 10-minute run
    /// once took 3.2 s after a leader kill; 12 kills, median 1.7 s).
    /// After a rebuilt etcd (counted from its return), one more: every sidecar's session is
    /// new (a wipe) or its hold ended by the new epoch (a restore).
    pub fn recovery_limit(self) -> Duration {
        let leader = [Kind::LeaderKill, Kind::LeaderStall, Kind::LeaderPartition];
        let election = leader.contains(&self) as u64;
        let rebuilt = self.rebuilds() as u64;
        TTL + Duration::from_secs(1 + election + rebuilt)
    }

    /// Whether it rebuilds etcd: its recovery counts from when etcd came back.
    pub fn rebuilds(self) -> bool {
        matches!(self, Kind::Restored | Kind::Wiped)
    }

    /// The semaphore's `maxHolders` it sets, if it sets it.
    pub fn max_holders(self) -> Option<u32> {
        match self {
            Kind::PoolLowered => Some(POOL_LOWERED),
            Kind::PoolRaised => Some(POOL_SLOTS),
            _ => None,
        }
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
            Kind::FollowerPartition => "etcd follower partitioned past the TTL",
            Kind::LeaderPartition => "etcd leader partitioned past the TTL",
            Kind::SettingsRewrite => "lock settings rewritten",
            Kind::ReleasePause => "pause past the TTL before release",
            Kind::WorkerStall => "holder stalled past its heartbeat",
            Kind::LockDeleted => "DistributedLock deleted and created again",
            Kind::PodDeleted => "holder's Pod deleted, sidecar running",
            Kind::PoolLowered => "semaphore maxHolders 2 -> 1, waiters queued",
            Kind::PoolRaised => "semaphore maxHolders 1 -> 2, waiters queued",
            Kind::ForceRelease => "force release (kubectl annotate)",
            Kind::YieldAsked => "holder asked to yield within 1 s (kubectl annotate)",
            Kind::LateAnswers => "etcd member answers 1.5 s late",
            Kind::Restored => "etcd restored from a snapshot, --bump-revision",
            Kind::Wiped => "etcd wiped, DistributedLock deleted and created again",
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

impl Fault {
    /// When its lock's recovery starts: for a rebuilt etcd, when it came back.
    pub fn recovery_from(&self) -> f64 {
        if self.kind.rebuilds() { self.until } else { self.at }
    }
}

impl Rig {
    /// Injects one fault of `kind` (`round` picks among victims); `None` if there was no
    /// victim to be had.
    async fn inject(&mut self, kind: Kind, round: usize) -> Option<Fault> {
        let (target, at) = match kind {
            Kind::SidecarKill => self.kill_sidecar(round).await,
            Kind::Pause | Kind::ReleasePause | Kind::WorkerStall => self.stall(kind, round).await?,
            Kind::FollowerKill
            | Kind::LeaderKill
            | Kind::FollowerStall
            | Kind::LeaderStall
            | Kind::FollowerPartition
            | Kind::LeaderPartition => self.hit_etcd(kind, round).await?,
            Kind::SettingsRewrite => {
                let (at, ttl) = (now(), TTL.as_secs().to_string());
                let args = [COUNTER, "--namespace", NAMESPACE, "--ttl-seconds", &ttl];
                block_in_place(|| declare(&self.endpoints, &args));
                (0, at)
            }
            Kind::LockDeleted => {
                let at = now();
                recreate_lock(self, COUNTER, 1).await;
                (0, at)
            }
            Kind::PodDeleted => self.delete_pod(round).await,
            Kind::ForceRelease | Kind::YieldAsked => self.administer(kind, round).await,
            Kind::PoolLowered | Kind::PoolRaised => self.set_pool_limit(kind).await,
            Kind::LateAnswers => {
                self.late
                    .arm(format!("/podlock/v1/queue/{NAMESPACE}/{COUNTER}/").as_bytes());
                (0, now())
            }
            Kind::Restored => self.restore_etcd().await,
            Kind::Wiped => self.wipe_etcd().await,
        };
        Some(Fault {
            kind,
            target,
            at,
            until: now(),
        })
    }

    /// kill -9 of the mutex holder's sidecar (or one picked by `round`), and a new sidecar for
    /// its pod; returns the worker and when it was killed.
    async fn kill_sidecar(&mut self, round: usize) -> (usize, f64) {
        let i = self.holder().await.unwrap_or(round % self.counter_workers());
        let at = now();
        self.replace_sidecar(i).await;
        (i, at)
    }

    /// Stalls a mutex worker picked by `round` (and for a pause its sidecar, for the TTL plus
    /// 1 s); returns the worker and when it stalled, or `None` if it did not get to stall.
    async fn stall(&mut self, kind: Kind, round: usize) -> Option<(usize, f64)> {
        let i = self.start_stall(kind, round % self.counter_workers()).await?;
        let at = now();
        if kind == Kind::WorkerStall {
            sleep(STALL).await; // only the worker stalls; its sidecar runs on
        } else {
            self.sidecars[i].signal(libc::SIGSTOP);
            sleep(TTL + Duration::from_secs(1)).await;
            self.sidecars[i].signal(libc::SIGCONT);
        }
        Some((i, at))
    }

    /// Makes mutex worker `i` stall once it holds (before its release for a
    /// [`Kind::ReleasePause`], else between its grant and its write; heartbeating if only the
    /// operator is to end its hold); returns it once it stalls, holding, or `None` if it did
    /// not get to stall within 10 s.
    pub async fn start_stall(&self, kind: Kind, i: usize) -> Option<usize> {
        let slot = &self.slots[i];
        // A hung app whose heartbeat still runs: only the operator ends its hold.
        let beating = matches!(kind, Kind::ForceRelease | Kind::YieldAsked | Kind::PodDeleted);
        slot.stall_beating.store(beating, Ordering::Relaxed);
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
            slot.stall_beating.store(false, Ordering::Relaxed);
            return None;
        }
        Some(i)
    }

    /// Kills, stalls (SIGSTOP) or partitions (each for the TTL plus 1 s) the etcd leader or a
    /// follower picked by `round`; returns the member and when it was hit, or `None` if no
    /// member said it led.
    async fn hit_etcd(&mut self, kind: Kind, round: usize) -> Option<(usize, f64)> {
        let leader = self.leader().await?;
        let leads = matches!(kind, Kind::LeaderKill | Kind::LeaderStall | Kind::LeaderPartition);
        let victim = if leads {
            leader
        } else {
            (leader + 1 + round % 2) % self.etcd.len()
        };
        let at = now();
        if matches!(kind, Kind::FollowerStall | Kind::LeaderStall) {
            self.etcd[victim].signal(libc::SIGSTOP);
            sleep(TTL + Duration::from_secs(1)).await;
            self.etcd[victim].signal(libc::SIGCONT);
        } else if matches!(kind, Kind::FollowerPartition | Kind::LeaderPartition) {
            self.net.cut(victim);
            assert!(
                !answers(&self.etcd[victim].endpoint).await,
                "a partitioned member answered"
            );
            sleep(TTL + Duration::from_secs(1)).await;
            self.net.heal(victim);
        } else {
            self.etcd[victim].stop();
            sleep(Duration::from_secs(1)).await;
            self.etcd[victim].resume().await;
        }
        Some((victim, at))
    }

    /// Sets the semaphore's `maxHolders` as `kind` says, once waiters queue behind its full
    /// window (or after 2 s without); returns when the change began.
    async fn set_pool_limit(&self, kind: Kind) -> (usize, f64) {
        let limit = kind.max_holders().expect("a change of maxHolders");
        let full = if kind == Kind::PoolLowered {
            POOL_SLOTS
        } else {
            POOL_LOWERED
        };
        let _ = wait_until(Duration::from_secs(2), || async {
            let (_, info) = self.sidecars[0].get(&format!("/v1/locks/{POOL}")).await;
            let holders = info["holders"].as_array().map_or(0, Vec::len);
            info["waiters"].as_u64() > Some(0) && holders >= full as usize
        })
        .await;
        (0, self.patch_pool_limit(limit).await)
    }
}

/// Whether the etcd member at `endpoint` answers a health check, on a new connection, within
/// 300 ms.
async fn answers(endpoint: &str) -> bool {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    http.get(format!("{endpoint}/health")).send().await.is_ok()
}

/// Injects faults for `seconds`, and at least two of each kind, each after half a second of
/// normal work and only once the lock made progress after the previous one.
pub async fn run(rig: &mut Rig, seconds: f64) -> Vec<Fault> {
    let start = now();
    let mut faults = vec![];
    let mut round = 0;
    let cycle = Kind::CYCLE;
    while now() - start < seconds || round < 2 * cycle.len() {
        sleep(Duration::from_millis(500)).await;
        let kind = cycle[round % cycle.len()];
        round += 1;
        let Some(fault) = rig.inject(kind, round).await else {
            continue;
        };
        faults.push(fault);
        // The checker reports a fault after which progress did not resume.
        let _ = wait_until(Duration::from_secs(20), || async {
            rig.progressed_since(fault.recovery_from())
        })
        .await;
    }
    faults
}
