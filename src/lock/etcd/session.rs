//! Sessions: one etcd lease per TTL, kept alive while the sidecar lives.
//!
//! Every hold and waiter of this sidecar with the same TTL shares one lease, as in etcd's
//! `concurrency.Session`: an uncontended acquire then costs one transaction, and the operator
//! revokes a dead pod's holds by revoking its few leases. A session is *lost* when etcd says the
//! lease is gone, or when the last confirmed keepalive plus the TTL has passed: from that moment
//! the sidecar no longer reports anything held under it.

use etcd_client::Client;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::link::{Clients, Link};
use super::members::Route;
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Etcd;
use crate::retry::{self, Pauses};

/// How long one keepalive round trip may take before it counts as failed and is sent again on
/// a new stream: at most 2 s, and a quarter of the TTL, so that a keepalive stream stuck on a
/// stalled etcd member is given up well before the lease could run out.
fn keepalive_timeout(ttl: u32) -> Duration {
    Duration::from_millis(u64::from(ttl) * 250).min(Duration::from_secs(2))
}

/// One lease and its keepalive task.
#[derive(Debug)]
pub struct Session {
    /// The etcd lease id.
    pub id: i64,
    /// The lease TTL in seconds.
    pub ttl: u32,
    lost: CancellationToken,
    /// Milliseconds since `epoch` at which the lease may have expired.
    expires_ms: AtomicU64,
    epoch: Instant,
}

impl Session {
    /// Completes when the session is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Whether the session is lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Ends the session because etcd no longer has its lease (`why`): its holds are lost and
    /// the next acquire with its TTL starts a new session at once, not after the next
    /// keepalive (up to TTL/3 later).
    pub fn end(&self, why: &str) {
        if !self.lost.is_cancelled() {
            warn!(lease = format_args!("{:x}", self.id), why, "session lost");
            self.lost.cancel();
        }
    }

    /// The earliest moment at which etcd may expire the lease.
    pub fn expires_at(&self) -> Instant {
        self.epoch + Duration::from_millis(self.expires_ms.load(Ordering::Acquire))
    }

    fn confirm(&self, sent: Instant) {
        let ms = (sent + Duration::from_secs(self.ttl.into()) - self.epoch).as_millis() as u64;
        self.expires_ms.store(ms, Ordering::Release);
    }
}

/// The sidecar's sessions, by TTL.
#[derive(Clone)]
pub struct Sessions {
    etcd: Etcd,
    by_ttl: Arc<Mutex<BTreeMap<u32, Arc<Session>>>>,
    keepalive_failures: Arc<AtomicU64>,
}

impl Sessions {
    /// An empty set of sessions on `etcd`; their keepalives go to its members that answer.
    pub fn new(etcd: Etcd) -> Self {
        Sessions {
            etcd,
            by_ttl: Arc::default(),
            keepalive_failures: Arc::default(),
        }
    }

    /// How many keepalives have failed since start.
    pub fn keepalive_failures(&self) -> u64 {
        self.keepalive_failures.load(Ordering::Relaxed)
    }

    /// The live session for `ttl`, granting a lease the first time.
    pub async fn get(&self, ttl: u32) -> Result<Arc<Session>, LockError> {
        let mut map = self.by_ttl.lock().await;
        if let Some(s) = map.get(&ttl).filter(|s| !s.is_lost()) {
            return Ok(s.clone());
        }
        let sent = Instant::now();
        let id = self.etcd.lease_grant(ttl).await?;
        let session = Arc::new(Session {
            id,
            ttl,
            lost: CancellationToken::new(),
            expires_ms: AtomicU64::new(0),
            epoch: sent,
        });
        session.confirm(sent);
        info!(lease = format_args!("{id:x}"), ttl, "session started");
        tokio::spawn(keep_alive(
            self.etcd.link().clone(),
            session.clone(),
            self.keepalive_failures.clone(),
        ));
        map.insert(ttl, session.clone());
        Ok(session)
    }

    /// The sessions not lost.
    pub async fn live(&self) -> Vec<Arc<Session>> {
        let map = self.by_ttl.lock().await;
        map.values().filter(|s| !s.is_lost()).cloned().collect()
    }

    /// Revokes every lease: all holds and waits of this sidecar end at once.
    pub async fn close(&self) {
        let sessions: Vec<_> = std::mem::take(&mut *self.by_ttl.lock().await)
            .into_values()
            .collect();
        for s in sessions {
            s.lost.cancel();
            if let Err(e) = self.etcd.lease_revoke(s.id).await {
                warn!(lease = format_args!("{:x}", s.id), error = %e, "revoke at shutdown failed");
            }
        }
    }
}

/// Keeps `session`'s lease alive every TTL/3 until etcd says it is gone or the last confirmed
/// keepalive is older than the TTL; then marks the session lost and revokes the lease, in case
/// etcd still has it (a leader change can extend TTLs). The stream goes to a member that
/// answers (see [`Members`](super::members::Members)), of the clients current when it opens
/// (see [`Link`]); a member that fails or leaves a keepalive unanswered is marked
/// suspect, so that neither the next keepalive nor the sidecar's watches and requests go back
/// to it, and a member that watches or requests found silent is not chosen for the next stream.
async fn keep_alive(link: Link, session: Arc<Session>, failures: Arc<AtomicU64>) {
    let mut route: Option<(Arc<Clients>, Route)> = None;
    let period = Duration::from_millis(u64::from(session.ttl) * 1000 / 3);
    let mut stream = None;
    let mut next = Instant::now() + period;
    let mut pauses = Pauses::new(retry::keepalive(session.ttl));
    let reason = loop {
        tokio::select! {
            _ = sleep_until(next.min(session.expires_at())) => {}
            _ = session.lost() => return,
        }
        if Instant::now() >= session.expires_at() {
            break "no keepalive confirmed within the TTL";
        }
        let sent = Instant::now();
        let limit = keepalive_timeout(session.ttl);
        let (clients, (member, via)) = route
            .get_or_insert_with(|| {
                let clients = link.current();
                let picked = clients.pick();
                (clients, picked)
            })
            .clone();
        let failure = match timeout(limit, renew(&via, session.id, &mut stream)).await {
            Ok(Ok(ttl)) if ttl > 0 => {
                session.confirm(sent);
                next = sent + period;
                continue;
            }
            Ok(Ok(_)) => break "etcd reports the lease expired or revoked",
            Ok(Err(e)) => {
                warn!(lease = format_args!("{:x}", session.id), error = %e, "keepalive failed");
                "a keepalive failed"
            }
            Err(_) => {
                warn!(lease = format_args!("{:x}", session.id), "keepalive timed out");
                "a keepalive went unanswered"
            }
        };
        failures.fetch_add(1, Ordering::Relaxed);
        clients.members.suspect(member, failure);
        (stream, route) = (None, None);
        next = Instant::now() + pauses.next_pause();
    };
    warn!(lease = format_args!("{:x}", session.id), reason, "session lost");
    session.lost.cancel();
    // Best effort: if etcd still has the lease, revoke it so no key outlives our belief.
    let mut client = link.current().client.clone();
    let _ = timeout(Duration::from_secs(5), client.lease_revoke(session.id)).await;
}

type KeepAlive = (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream);

/// Sends one keepalive on `stream` (opening it if needed) and returns the TTL etcd granted.
async fn renew(client: &Client, id: i64, stream: &mut Option<KeepAlive>) -> Result<i64, LockError> {
    if stream.is_none() {
        *stream = Some(client.clone().lease_keep_alive(id).await?);
    }
    let (keeper, responses) = stream.as_mut().expect("opened above");
    keeper.keep_alive().await?;
    match responses.message().await? {
        Some(resp) => Ok(resp.ttl()),
        None => Err(Unavailable::KeepaliveEnded.into()),
    }
}

#[cfg(test)]
impl Session {
    /// A session etcd never saw, confirmed now: for tests of the logic around a session.
    pub(crate) fn detached(ttl: u32) -> Arc<Self> {
        let now = Instant::now();
        let session = Session {
            id: 1,
            ttl,
            lost: CancellationToken::new(),
            expires_ms: AtomicU64::new(0),
            epoch: now,
        };
        session.confirm(now);
        Arc::new(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_give_up_on_a_member_well_inside_the_ttl() {
        assert_eq!(keepalive_timeout(2), Duration::from_millis(500));
        assert_eq!(keepalive_timeout(15), Duration::from_secs(2));
        retry::assert_pauses(retry::keepalive(2), &[250, 250]);
        retry::assert_pauses(retry::keepalive(3600), &[500, 500]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_may_expire_a_ttl_after_its_last_confirmed_keepalive() {
        let session = Session::detached(2);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let sent = Instant::now();
        session.confirm(sent);
        assert_eq!(session.expires_at(), sent + Duration::from_secs(2));
    }
}
