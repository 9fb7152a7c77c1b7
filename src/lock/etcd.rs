//! A thin wrapper over the etcd client that counts requests and watch events, so benchmarks
//! can show that etcd work per release stays flat as a queue grows.

use etcd_client::{
    Client, GetOptions, GetResponse, LeaseTimeToLiveOptions, Txn, TxnResponse, WatchFilterType, WatchOptions,
    WatchStream,
};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;
use tokio::time::{Instant, timeout, timeout_at};

use super::LockError;
use super::error::EtcdFailure;

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

/// How long a watch may be silent before etcd is asked whether it still serves it, and how long
/// that answer may take (see [`KeyWatch::next`]). A stalled member is thus left within about
/// twice this, inside the 1 s the contract allows for a `lost` notice and a handoff. It costs one
/// small message on the watch's stream per silent interval.
const WATCH_SILENCE: Duration = Duration::from_millis(400);

/// The pause before sending a failed request again (a refused connection fails at once).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Counters of the etcd work this process caused.
#[derive(Debug, Default)]
pub struct Stats {
    /// Unary requests (range, txn, lease grant/revoke), not counting keepalives.
    pub requests: AtomicU64,
    /// Watch events received.
    pub watch_events: AtomicU64,
}

/// An etcd client with counters.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    stats: Arc<Stats>,
}

impl Etcd {
    /// Wraps `client`.
    pub fn new(client: Client) -> Self {
        Etcd {
            client,
            stats: Arc::default(),
        }
    }

    /// The underlying client, for what this wrapper does not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Runs `request` hedged (see [`hedged`]), counting every attempt.
    async fn retrying<T, F: Future<Output = Result<T, etcd_client::Error>>>(
        &self,
        request: impl Fn() -> F,
    ) -> Result<T, LockError> {
        hedged(&self.stats.requests, request).await
    }

    /// Runs a transaction (sent again if need be: see [`HEDGE`]).
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        self.retrying(|| {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
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
        self.retrying(|| {
            let (mut kv, key, opts) = (self.client.kv_client(), key.clone(), opts.clone());
            async move { kv.get(key, opts).await }
        })
        .await
    }

    /// The keys attached to lease `id`, or `None` if etcd no longer has the lease.
    pub async fn lease_keys(&self, id: i64) -> Result<Option<Vec<Vec<u8>>>, LockError> {
        let resp = self
            .retrying(|| {
                let (mut lease, opts) = (self.client.lease_client(), LeaseTimeToLiveOptions::new());
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
            .retrying(|| {
                let mut lease = self.client.lease_client();
                async move { lease.grant(ttl.into(), None).await }
            })
            .await?;
        Ok(resp.id())
    }

    /// Revokes lease `id` (sent again if need be: a revoke takes effect once).
    pub async fn lease_revoke(&self, id: i64) -> Result<(), LockError> {
        self.retrying(|| {
            let mut lease = self.client.lease_client();
            async move { lease.revoke(id).await }
        })
        .await
        .map(drop)
    }

    /// Watches each of `targets` on one stream, each from its own revision on (see
    /// [`Target::from`]) or from the current revision.
    ///
    /// Returns once etcd confirmed every watch, with the revision the watches start after:
    /// every change after it will be delivered. Watching from "now" rather than from a past
    /// revision keeps the watch on etcd's synced path; a watch that starts in the past waits for
    /// etcd's 100 ms catch-up loop, which is what makes etcd's own Mutex hand off slowly. Where
    /// that delay does not matter, a start revision saves the read that would close the gap.
    pub async fn watch_keys(&self, targets: &[Target]) -> Result<KeyWatch, LockError> {
        let opts = |t: &Target| {
            let filters = if t.puts {
                vec![]
            } else {
                vec![WatchFilterType::NoPut]
            };
            let o = WatchOptions::new().with_filters(filters);
            Some(match t.from {
                Some(rev) => o.with_start_revision(rev),
                None => o,
            })
        };
        let (first, rest) = targets
            .split_first()
            .ok_or_else(|| LockError::Invalid("nothing to watch".into()))?;
        // Opening the stream waits for the member's answer: bounded, as a stalled member never
        // gives one (the watch's own silence check starts only once it is open).
        let mut client = self.client.watch_client();
        let open = client.watch(first.key.clone(), opts(first));
        let mut stream = timeout(2 * WATCH_SILENCE, open).await.map_err(|_| {
            LockError::Unavailable(format!(
                "the etcd member did not open a watch within {:?} (stalled or cut off)",
                2 * WATCH_SILENCE
            ))
        })??;
        for t in rest {
            stream.watch(t.key.clone(), opts(t)).await?;
        }
        let mut watch = KeyWatch {
            stream,
            stats: self.stats.clone(),
            start_revision: 0,
            fired: false,
        };
        let mut created = 0;
        while created < targets.len() && !watch.fired {
            let resp = watch.next().await?;
            if resp.created() {
                // etcd answers a stream's creates in the order they were sent.
                let rev = match targets[created].from {
                    Some(from) => from - 1,
                    None => resp.header().map_or(0, |h| h.revision()),
                };
                created += 1;
                watch.start_revision = watch.start_revision.max(rev);
            }
        }
        Ok(watch)
    }
}

/// Runs `request`: sends it again after a transient error, or when no attempt answered
/// within [`HEDGE`]; the first answer wins. Fails after [`BUDGET`]. Counts each attempt in
/// `sent`.
async fn hedged<T, F: Future<Output = Result<T, etcd_client::Error>>>(
    sent: &AtomicU64,
    request: impl Fn() -> F,
) -> Result<T, LockError> {
    let deadline = Instant::now() + BUDGET;
    let mut attempts: VecDeque<Pin<Box<F>>> = VecDeque::new();
    let mut send_at = Instant::now();
    let mut error = LockError::Unavailable(format!("etcd did not answer within {BUDGET:?}"));
    while Instant::now() < deadline {
        if Instant::now() >= send_at {
            if attempts.len() == MAX_ATTEMPTS {
                attempts.pop_front(); // the oldest is likeliest stuck on a dead member
            }
            sent.fetch_add(1, Ordering::Relaxed);
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
            Ok((_, Ok(resp))) => return Ok(resp),
            Ok((_, Err(e))) if EtcdFailure::of(&e) != EtcdFailure::Transient => return Err(e.into()),
            Ok((i, Err(e))) => {
                attempts.remove(i);
                error = e.into();
                send_at = send_at.min(Instant::now() + RETRY_PAUSE);
            }
            Err(_) => {} // time to send again, or to give up
        }
    }
    Err(error)
}

/// A key to watch, for deletion only or for any change, from a revision or from now.
#[derive(Debug, Clone)]
pub struct Target {
    key: Vec<u8>,
    puts: bool,
    from: Option<i64>,
}

impl Target {
    /// Watch `key` for its deletion.
    pub fn deletion(key: &[u8]) -> Self {
        Target {
            key: key.to_vec(),
            puts: false,
            from: None,
        }
    }

    /// Watch `key` for any write or deletion.
    pub fn any_change(key: &[u8]) -> Self {
        Target {
            key: key.to_vec(),
            puts: true,
            from: None,
        }
    }

    /// Watch from revision `rev` on (`None`: from now). Changes after a read at `rev - 1` then
    /// cannot be missed without reading again, at the cost of etcd's catch-up delay (up to
    /// 100 ms) for this key.
    pub fn from(self, rev: Option<i64>) -> Self {
        Target { from: rev, ..self }
    }
}

/// Watches made by [`Etcd::watch_keys`].
pub struct KeyWatch {
    stream: WatchStream,
    stats: Arc<Stats>,
    /// The largest revision at which a watch was created.
    pub start_revision: i64,
    fired: bool,
}

impl KeyWatch {
    /// The next message on the stream. After [`WATCH_SILENCE`] without one, etcd is asked for a
    /// progress notification (answered at once by a member that serves); without an answer
    /// within another [`WATCH_SILENCE`] the member is taken for stalled and this fails, so the
    /// caller reads again and watches anew instead of sleeping on a silent stream until HTTP/2
    /// keepalive gives up (~5 s).
    async fn next(&mut self) -> Result<etcd_client::WatchResponse, LockError> {
        let mut asked = false;
        let resp = loop {
            match timeout(WATCH_SILENCE, self.stream.message()).await {
                Ok(message) => break message?,
                Err(_) if asked => {
                    return Err(LockError::Unavailable(format!(
                        "the etcd member serving a watch did not answer a progress request within \
                         {WATCH_SILENCE:?} (stalled or cut off)"
                    )));
                }
                Err(_) => {
                    self.stream.request_progress().await?;
                    asked = true;
                }
            }
        };
        let resp = resp.ok_or_else(|| LockError::Unavailable("etcd closed the watch stream".into()))?;
        if resp.canceled() {
            return Err(LockError::Unavailable(format!(
                "etcd cancelled a watch: {}",
                resp.cancel_reason()
            )));
        }
        let n = resp.events().len() as u64;
        if n > 0 {
            self.stats.watch_events.fetch_add(n, Ordering::Relaxed);
            self.fired = true;
        }
        Ok(resp)
    }

    /// Completes when any watched key changes (at once if one already did).
    pub async fn changed(&mut self) -> Result<(), LockError> {
        while !self.fired {
            self.next().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    type Answer = Pin<Box<dyn Future<Output = Result<i32, etcd_client::Error>>>>;

    /// Runs `hedged` over `answers` (the n-th attempt gets the n-th; later ones never answer);
    /// returns the result, how many attempts were sent, and how long it took (paused time).
    async fn run(answers: Vec<fn() -> Answer>) -> (Result<i32, LockError>, u64, Duration) {
        let sent = AtomicU64::new(0);
        let start = Instant::now();
        let result = hedged(&sent, || {
            let n = sent.load(Ordering::Relaxed) as usize - 1;
            answers
                .get(n)
                .map_or_else(|| Box::pin(pending()) as Answer, |a| a())
        })
        .await;
        (result, sent.load(Ordering::Relaxed), start.elapsed())
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

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_final() {
        let (result, sent, _) = run(vec![denied, ok]).await;
        assert!(matches!(result, Err(LockError::Forbidden(_))), "{result:?}");
        assert_eq!(sent, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_ends_at_the_budget() {
        let (result, sent, took) = run(vec![]).await;
        assert!(matches!(result, Err(LockError::Unavailable(_))), "{result:?}");
        assert_eq!(
            (sent, took),
            ((BUDGET.as_millis() / HEDGE.as_millis()) as u64, BUDGET)
        );
    }
}
