//! Sessions: one etcd lease per TTL, kept alive while the sidecar lives.
//!
//! Every hold and waiter of this sidecar with the same TTL shares one lease, as in etcd's
//! `concurrency.Session`: an uncontended acquire then costs one transaction, and the operator
//! revokes a dead pod's holds by revoking its few leases. A session is *lost* when etcd says the
//! lease is gone, or when the last confirmed keepalive plus the TTL has passed: from that moment
//! the sidecar no longer reports anything held under it.
//!
//! A session's keepalive stream also tells when etcd went away: it ends, or a keepalive fails.
//! The first keepalive confirmed after that is reported ([`Resumed`]), with the revision etcd was
//! at before, so that the engine can find out whether etcd came back restored from a snapshot
//! and remove what the restore brought back on the lease (`engine/state.rs`). A session lost
//! meanwhile has its lease revoked as soon as etcd answers again.

use etcd_client::Client;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, mpsc};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::link::{Clients, Link};
use super::members::Route;
use crate::lock::error::etcd::EtcdFailure;
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

/// A session whose keepalives were cut off (its stream ended, or a keepalive failed) and are
/// confirmed again: etcd may have come back restored from a snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Resumed {
    /// The session's lease.
    pub lease: i64,
    /// etcd's revision at the last keepalive confirmed before the break.
    pub revision: i64,
}

/// How many [`Resumed`] reports may wait for the engine; more are dropped (the engine's
/// periodic orphan sweep still comes).
const RESUMED: usize = 16;

/// The sidecar's sessions, by TTL.
#[derive(Clone)]
pub struct Sessions {
    etcd: Etcd,
    by_ttl: Arc<Mutex<BTreeMap<u32, Arc<Session>>>>,
    keepalive_failures: Arc<AtomicU64>,
    resumed: mpsc::Sender<Resumed>,
}

impl Sessions {
    /// An empty set of sessions on `etcd`, their keepalives going to its members that answer;
    /// and where their [`Resumed`] reports arrive.
    pub fn new(etcd: Etcd) -> (Self, mpsc::Receiver<Resumed>) {
        let (resumed, reports) = mpsc::channel(RESUMED);
        let sessions = Sessions {
            etcd,
            by_ttl: Arc::default(),
            keepalive_failures: Arc::default(),
            resumed,
        };
        (sessions, reports)
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
        tokio::spawn(keep_alive(Keeper {
            link: self.etcd.link().clone(),
            session: session.clone(),
            failures: self.keepalive_failures.clone(),
            resumed: self.resumed.clone(),
            route: None,
            stream: None,
            revision: 0,
            broke: None,
        }));
        map.insert(ttl, session.clone());
        Ok(session)
    }

    /// The sessions not lost.
    pub async fn live(&self) -> Vec<Arc<Session>> {
        let map = self.by_ttl.lock().await;
        map.values().filter(|s| !s.is_lost()).cloned().collect()
    }

    /// The leases of its sessions, lost ones included until a new session replaces them.
    pub async fn leases(&self) -> Vec<i64> {
        self.by_ttl.lock().await.values().map(|s| s.id).collect()
    }

    /// Whether etcd refused a put under `session` for its lease rather than for the key: since
    /// etcd 3.6.11 a put with a lease needs access to every key already on it, and another etcd
    /// user may attach a key of its own to a lease that carries none of ours (#55 F16). etcd
    /// then refuses us the lease's keys too. Such a session carries nothing of this sidecar
    /// (its keys would have kept the other user out), so it is ended and a new one taken.
    pub async fn poisoned(&self, session: &Session) -> bool {
        let refused = matches!(
            self.etcd.lease_keys(session.id).await,
            Err(LockError::Forbidden(_))
        );
        if refused {
            session.end("etcd refuses its keys: another etcd user attached a key to its lease");
        }
        refused
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
/// keepalive is older than the TTL; then marks the session lost and revokes the lease (see
/// [`revoke`]). The stream goes to a member that answers (see
/// [`Members`](super::members::Members)), of the clients current when it opens (see [`Link`]);
/// a member that fails, leaves a keepalive unanswered or ends the stream is marked suspect, so
/// that neither the next keepalive nor the sidecar's watches and requests go back to it, and a
/// member that watches or requests found silent is not chosen for the next stream.
async fn keep_alive(mut k: Keeper) {
    let period = Duration::from_millis(u64::from(k.session.ttl) * 1000 / 3);
    // The first at once: it opens the stream whose end tells that etcd went away.
    let mut next = Instant::now();
    let mut pauses = Pauses::new(retry::keepalive(k.session.ttl));
    let reason = loop {
        let ended = tokio::select! {
            _ = sleep_until(next.min(k.session.expires_at())) => false,
            _ = k.session.lost() => return,
            _ = ended(&mut k.stream) => true,
        };
        if ended {
            // Its member went away (etcd stopping, say): renew soon, on a new stream.
            k.give_up_route("its keepalive stream ended");
            next = Instant::now() + pauses.next_pause();
            continue;
        }
        if Instant::now() >= k.session.expires_at() {
            break "no keepalive confirmed within the TTL";
        }
        let sent = Instant::now();
        match k.renew(sent).await {
            Renewal::Confirmed => next = sent + period,
            Renewal::Gone => break "etcd reports the lease expired or revoked",
            Renewal::Failed => next = Instant::now() + pauses.next_pause(),
        }
    };
    warn!(lease = format_args!("{:x}", k.session.id), reason, "session lost");
    k.session.lost.cancel();
    revoke(&k.link, k.session.id, &mut pauses).await;
}

/// A session's keepalive task: its stream, and what a break of it is to report.
struct Keeper {
    link: Link,
    session: Arc<Session>,
    failures: Arc<AtomicU64>,
    resumed: mpsc::Sender<Resumed>,
    /// The clients and member of the stream, once picked.
    route: Option<(Arc<Clients>, Route)>,
    stream: Option<KeepAlive>,
    /// etcd's revision at the last confirmed keepalive (0: none yet).
    revision: i64,
    /// `revision` when the stream last broke, until a keepalive is confirmed again.
    broke: Option<i64>,
}

/// What one keepalive came to.
enum Renewal {
    Confirmed,
    /// etcd no longer has the lease.
    Gone,
    Failed,
}

impl Keeper {
    /// Sends one keepalive (at `sent`), within a quarter of the TTL; the first confirmed after
    /// a break is reported.
    async fn renew(&mut self, sent: Instant) -> Renewal {
        let limit = keepalive_timeout(self.session.ttl);
        let link = &self.link;
        let (_, (_, via)) = self.route.get_or_insert_with(|| {
            let clients = link.current();
            let picked = clients.pick();
            (clients, picked)
        });
        let via = via.clone();
        let failure = match timeout(limit, renew(&via, self.session.id, &mut self.stream)).await {
            Ok(Ok((ttl, revision))) if ttl > 0 => {
                self.session.confirm(sent);
                if let Some(before) = self.broke.take() {
                    let resumed = Resumed {
                        lease: self.session.id,
                        revision: before,
                    };
                    let _ = self.resumed.try_send(resumed); // full: the periodic sweep remains
                }
                self.revision = revision;
                return Renewal::Confirmed;
            }
            Ok(Ok(_)) => return Renewal::Gone,
            Ok(Err(e)) => {
                warn!(lease = format_args!("{:x}", self.session.id), error = %e, "keepalive failed");
                "a keepalive failed"
            }
            Err(_) => {
                warn!(
                    lease = format_args!("{:x}", self.session.id),
                    "keepalive timed out"
                );
                "a keepalive went unanswered"
            }
        };
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.give_up_route(failure);
        Renewal::Failed
    }

    /// Leaves the stream and its member (suspect for `why`): the next keepalive picks anew, and
    /// the first it confirms reports the break.
    fn give_up_route(&mut self, why: &'static str) {
        if let Some((clients, (member, _))) = self.route.take() {
            clients.members.suspect(member, why);
        }
        self.stream = None;
        if self.revision > 0 {
            self.broke.get_or_insert(self.revision);
        }
    }
}

/// Completes when `stream` yields anything between keepalives: it answers nothing else, so that
/// is its end (its member closed it). Never without a stream.
async fn ended(stream: &mut Option<KeepAlive>) {
    match stream {
        Some((_, responses)) => drop(responses.message().await),
        None => std::future::pending().await,
    }
}

/// Revokes the lease of a session given up, as soon as etcd answers: etcd may still have it (a
/// leader change can extend TTLs, and an etcd that was down, or restored from a snapshot, keeps
/// its leases for a new TTL), and its keys would outlive the holds this sidecar reported lost,
/// current to every view and the fence check. Tried until etcd revokes it or says it is gone.
async fn revoke(link: &Link, id: i64, pauses: &mut Pauses) {
    loop {
        let mut client = link.current().client.clone();
        match timeout(Duration::from_secs(5), client.lease_revoke(id)).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) if !EtcdFailure::of(&e).worth_resending() => return,
            _ => sleep(pauses.next_pause()).await,
        }
    }
}

type KeepAlive = (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream);

/// Sends one keepalive on `stream` (opening it if needed); returns the TTL etcd granted and
/// etcd's revision.
async fn renew(client: &Client, id: i64, stream: &mut Option<KeepAlive>) -> Result<(i64, i64), LockError> {
    if stream.is_none() {
        *stream = Some(client.clone().lease_keep_alive(id).await?);
    }
    let (keeper, responses) = stream.as_mut().expect("opened above");
    keeper.keep_alive().await?;
    match responses.message().await? {
        Some(resp) => Ok((resp.ttl(), resp.header().map_or(0, |h| h.revision()))),
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
