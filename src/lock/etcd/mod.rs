//! A thin wrapper over the etcd client that counts requests and watch events, so benchmarks
//! can show that etcd work per release stays flat as a queue grows, and sends each request to a
//! member that answers (see [`Members`](self::members::Members)). Watches are in
//! [`watch`](self::watch); etcd's version against podlock's minimum in
//! [`version`](self::version).

pub(super) mod link;
pub(super) mod members;
pub(super) mod session;
pub(super) mod silence;
pub(super) mod version;
pub(super) mod watch;

use etcd_client::{Client, GetOptions, GetResponse, LeaseTimeToLiveOptions, Txn, TxnOpResponse, TxnResponse};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::time::{Instant, timeout_at};

use crate::lock::error::etcd::EtcdFailure;
use crate::lock::error::{LockError, Unavailable};
use link::{Clients, Link};

/// How long a read or transaction may go unanswered before it is sent once more, the earlier
/// attempts still running. A write that reaches a follower just after the leader died is
/// forwarded to the dead leader and lost: etcd answers it only at its own request timeout
/// (7 s), long after a new leader (elected 1 to 2 s after the old one died, with etcd's default
/// timeouts) could have served it. Sending it again is safe: every request of the engine is a
/// read, or a transaction guarded by a key's create revision or the settings' mod revision,
/// which takes effect at most once however often it is sent. (The enqueue's put-if-absent could
/// in principle take effect again if a copy were applied after the hold was released: see
/// docs/design.md, "etcd trouble".)
const HEDGE: Duration = Duration::from_millis(500);

/// At most this many attempts of one request run at once; a new one replaces the oldest.
const MAX_ATTEMPTS: usize = 3;

/// The budget of one request, all attempts included (the client's request timeout).
const BUDGET: Duration = Duration::from_secs(5);

/// The pause before sending a failed request again (a refused connection fails at once). Fixed,
/// not backing off: a request's retries stay within its budget and its hedge, and during an
/// etcd leader election ("no leader") a short fixed pause sends it within 50 ms of the new
/// leader. Backing off up to the hedge (as `retry::etcd` would) delayed recovery after etcd
/// faults by up to half a second per request, and the safety run's progress limits failed.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Counters of the etcd work this process caused.
#[derive(Debug, Default)]
pub struct Stats {
    /// Unary requests (range, txn, lease grant/revoke), not counting keepalives; every attempt
    /// of a request sent again counts.
    pub requests: AtomicU64,
    /// Of `requests`, the attempts sent again because an earlier one failed or went unanswered
    /// for `HEDGE`: on an overloaded etcd they show up as extra requests per grant.
    pub resent: AtomicU64,
    /// Watch events received.
    pub watch_events: AtomicU64,
    /// Watches created (one per key watched).
    pub watches: AtomicU64,
    /// Watch streams of [`Etcd::watch_keys`] open now (a wait's, an observer's): each holds
    /// its watches on etcd until dropped. The feeds' shared stream is not counted.
    pub open_streams: AtomicU64,
}

/// An etcd client with counters, which sends each new request and watch to a member that
/// answers (see [`Members`](self::members::Members)), through clients that can be replaced
/// (see [`Link`]).
#[derive(Clone)]
pub struct Etcd {
    pub(super) link: Link,
    pub(super) stats: Arc<Stats>,
}

impl Etcd {
    /// Wraps `client`, balanced over its endpoints.
    pub fn new(client: Client) -> Self {
        Etcd::with_members(client, vec![])
    }

    /// Wraps `client`, and `members` (one client per member, none for a single endpoint) for
    /// new requests and watches.
    pub fn with_members(client: Client, members: Vec<Client>) -> Self {
        let (link, stats) = (Link::new(client, members), Arc::<Stats>::default());
        Etcd { link, stats }
    }

    /// The underlying client, for what this wrapper does not cover.
    pub fn client(&self) -> Client {
        self.link.current().client.clone()
    }

    /// The clients, replaceable.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The counters, shared with what counts beside this client (the engine's feeds).
    pub(in crate::lock) fn shared_stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Runs `request` hedged (see [`hedged`]), counting every attempt. Each attempt goes to a
    /// member picked by [`Members`](self::members::Members); one sent again marks the member
    /// of the attempt before it suspect (it failed, or did not answer within [`HEDGE`]), so
    /// the next request avoids it.
    /// An attempt refused for an outdated auth token ([`EtcdFailure::AuthOutdated`]) gets a
    /// new one and is sent again like any transient failure; a refusal of the clients
    /// themselves is noted on the [`Link`].
    async fn retrying<T, F: Future<Output = Result<T, etcd_client::Error>>>(
        &self,
        request: impl Fn(Client) -> F,
    ) -> Result<T, LockError> {
        self.counting(request).await.answer
    }

    /// Like [`Etcd::retrying`], and says how many copies of the request were sent.
    async fn counting<T, F: Future<Output = Result<T, etcd_client::Error>>>(
        &self,
        request: impl Fn(Client) -> F,
    ) -> Sent<T> {
        // The member the last attempt went to, and the clients it was one of.
        let previous: Mutex<Option<(Option<usize>, Arc<Clients>)>> = Mutex::new(None);
        hedged(&self.stats, || {
            let mut previous = previous.lock().unwrap();
            if let Some((member, clients)) = &*previous {
                clients
                    .members
                    .suspect(*member, "a request failed or went unanswered");
            }
            let clients = self.link.current();
            let (member, client) = clients.pick();
            *previous = Some((member, clients.clone()));
            let answer = request(client.clone());
            async move {
                let answer = answer.await;
                if let Err(e) = &answer {
                    self.link.notice(&clients, e);
                    if EtcdFailure::of(e) == EtcdFailure::AuthOutdated {
                        // Sent again (see `hedged`) with the new token; a failed renewal shows
                        // in the next attempt's answer.
                        let _ = client.refresh_token().await;
                    }
                }
                answer
            }
        })
        .await
    }

    /// Runs a transaction (sent again if need be: see [`HEDGE`]).
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        self.txn_counting(txn).await.answer
    }

    /// Runs a transaction like [`Etcd::txn`], and says how many copies of it were sent: a
    /// copy not answered may still be applied after the answer (see [`late`](crate::lock::life::late)).
    pub async fn txn_counting(&self, txn: Txn) -> Sent<TxnResponse> {
        self.counting(|client| {
            let (mut kv, txn) = (client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Reads a key or range (sent again if need be: see [`HEDGE`]).
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, LockError> {
        let key = key.into();
        self.retrying(|client| {
            let (mut kv, key, opts) = (client.kv_client(), key.clone(), opts.clone());
            async move { kv.get(key, opts).await }
        })
        .await
    }

    /// Whether etcd's history no longer reaches back to `revision`: a count-only read of the
    /// `prefix` range at that revision finds it compacted, as a restore with
    /// `--mark-compacted` leaves every revision before it (see `engine/state.rs`).
    pub async fn compacted_past(&self, prefix: String, revision: i64) -> Result<bool, LockError> {
        let opts = GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_revision(revision);
        self.retrying(|client| {
            let (mut kv, prefix, opts) = (client.kv_client(), prefix.clone(), opts.clone());
            async move {
                match kv.get(prefix, Some(opts)).await {
                    Err(e) if EtcdFailure::of(&e) == EtcdFailure::Compacted => Ok(true),
                    answer => answer.map(|_| false),
                }
            }
        })
        .await
    }

    /// The keys attached to lease `id`, or `None` if etcd no longer has the lease.
    pub async fn lease_keys(&self, id: i64) -> Result<Option<Vec<Vec<u8>>>, LockError> {
        let resp = self
            .retrying(|client| {
                let (mut lease, opts) = (client.lease_client(), LeaseTimeToLiveOptions::new());
                async move { lease.time_to_live(id, Some(opts.with_keys())).await }
            })
            .await?;
        Ok((resp.ttl() > 0).then(|| resp.keys().to_vec()))
    }

    /// Grants a lease of `ttl` seconds; returns its id. Sent again if need be: a grant whose
    /// answer was not waited for leaves a lease that nobody keeps alive, which etcd expires
    /// after `ttl` with nothing attached.
    pub async fn lease_grant(&self, ttl: u32) -> Result<i64, LockError> {
        let resp = self
            .retrying(|client| {
                let mut lease = client.lease_client();
                async move { lease.grant(ttl.into(), None).await }
            })
            .await?;
        Ok(resp.id())
    }

    /// Revokes lease `id` (sent again if need be: a revoke takes effect once).
    pub async fn lease_revoke(&self, id: i64) -> Result<(), LockError> {
        self.retrying(|client| {
            let mut lease = client.lease_client();
            async move { lease.revoke(id).await }
        })
        .await
        .map(drop)
    }
}

/// A request's answer, and how many copies of it were sent.
#[derive(Debug)]
pub struct Sent<T> {
    /// The first answer, or the last error.
    pub answer: Result<T, LockError>,
    /// Copies sent: with more than one, a copy may be applied after the answer, by a member
    /// that received it before, or after, the one that answered.
    pub copies: u32,
}

impl<T> Sent<T> {
    /// The same copies, with `f` applied to the answer.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Sent<U> {
        Sent {
            answer: self.answer.map(f),
            copies: self.copies,
        }
    }
}

/// Runs `request`: sends it again after a transient error (after [`RETRY_PAUSE`]), or when no
/// attempt answered within [`HEDGE`]; the first answer wins. Fails after [`BUDGET`]. Counts
/// each attempt in `stats.requests`, and each after the first in `stats.resent` too.
async fn hedged<T, F: Future<Output = Result<T, etcd_client::Error>>>(
    stats: &Stats,
    request: impl Fn() -> F,
) -> Sent<T> {
    let deadline = Instant::now() + BUDGET;
    let mut attempts: VecDeque<Pin<Box<F>>> = VecDeque::new();
    let (mut send_at, mut copies) = (Instant::now(), 0);
    let mut error = LockError::from(Unavailable::Timeout(BUDGET));
    let sent = |answer, copies| Sent { answer, copies };
    while Instant::now() < deadline {
        if Instant::now() >= send_at {
            if attempts.len() == MAX_ATTEMPTS {
                attempts.pop_front(); // the oldest is likeliest stuck on a dead member
            }
            stats.requests.fetch_add(1, Ordering::Relaxed);
            if copies > 0 {
                stats.resent.fetch_add(1, Ordering::Relaxed);
            }
            copies += 1;
            attempts.push_back(Box::pin(request()));
            send_at = Instant::now() + HEDGE;
        }
        let answer = poll_fn(|cx| {
            let ready = attempts
                .iter_mut()
                .enumerate()
                .find_map(|(i, a)| match a.as_mut().poll(cx) {
                    Poll::Ready(r) => Some((i, r)),
                    Poll::Pending => None,
                });
            ready.map_or(Poll::Pending, Poll::Ready)
        });
        match timeout_at(send_at.min(deadline), answer).await {
            Ok((_, Ok(resp))) => return sent(Ok(resp), copies),
            Ok((_, Err(e))) if !EtcdFailure::of(&e).worth_resending() => return sent(Err(e.into()), copies),
            Ok((i, Err(e))) => {
                attempts.remove(i);
                error = e.into();
                send_at = send_at.min(Instant::now() + RETRY_PAUSE);
            }
            Err(_) => {} // time to send again, or to give up
        }
    }
    sent(Err(error), copies)
}

/// The answers of a transaction's get operations, in their order (its other operations
/// skipped): the reads the engine folds into one transaction.
pub(super) fn gets(ops: Vec<TxnOpResponse>) -> impl Iterator<Item = GetResponse> {
    ops.into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    type Answer = Pin<Box<dyn Future<Output = Result<i32, etcd_client::Error>>>>;

    /// Runs `hedged` over `answers` (the n-th attempt gets the n-th; later ones never answer);
    /// returns the result, how many attempts were sent, and how long it took (paused time).
    async fn run(answers: Vec<fn() -> Answer>) -> (Result<i32, LockError>, u64, Duration) {
        let stats = Stats::default();
        let start = Instant::now();
        let Sent { answer, copies } = hedged(&stats, || {
            let n = stats.requests.load(Ordering::Relaxed) as usize - 1;
            answers
                .get(n)
                .map_or_else(|| Box::pin(pending()) as Answer, |a| a())
        })
        .await;
        let sent = stats.requests.load(Ordering::Relaxed);
        assert_eq!(u64::from(copies), sent, "every copy sent is counted");
        assert_eq!(
            stats.resent.load(Ordering::Relaxed),
            sent - 1,
            "all but the first resent"
        );
        (answer, sent, start.elapsed())
    }

    fn silent() -> Answer {
        Box::pin(pending())
    }
    fn ok() -> Answer {
        Box::pin(async { Ok(7) })
    }
    fn unavailable() -> Answer {
        Box::pin(async { Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable("down"))) })
    }
    fn denied() -> Answer {
        Box::pin(async {
            Err(etcd_client::Error::GRpcStatus(tonic::Status::permission_denied(
                "no",
            )))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_is_sent_again_after_the_hedge() {
        let (result, sent, took) = run(vec![silent, ok]).await;
        assert_eq!((result.unwrap(), sent, took), (7, 2, HEDGE));
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_error_is_retried_after_a_short_pause() {
        let (result, sent, took) = run(vec![unavailable, ok]).await;
        assert_eq!((result.unwrap(), sent, took), (7, 2, RETRY_PAUSE));
    }

    fn auth_outdated() -> Answer {
        let old = "etcdserver: revision of auth store is old";
        Box::pin(async move {
            Err(etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
                old,
            )))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_refused_for_an_outdated_token_is_sent_again() {
        let (result, sent, took) = run(vec![auth_outdated, ok]).await;
        assert_eq!((result.unwrap(), sent, took), (7, 2, RETRY_PAUSE));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_final() {
        let (result, sent, _) = run(vec![denied, ok]).await;
        assert!(matches!(result, Err(LockError::Forbidden(_))), "{result:?}");
        assert_eq!(sent, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_ends_at_the_budget() {
        let (result, sent, took) = run(vec![]).await;
        assert!(
            matches!(result, Err(LockError::Unavailable(Unavailable::Timeout(_)))),
            "{result:?}"
        );
        assert_eq!(
            (sent, took),
            ((BUDGET.as_millis() / HEDGE.as_millis()) as u64, BUDGET)
        );
    }
}
