//! A thin wrapper over the etcd client that counts requests and watch events, so benchmarks
//! can show that etcd work per release stays flat as a queue grows.

use etcd_client::{
    Client, GetOptions, GetResponse, Txn, TxnResponse, WatchFilterType, WatchOptions, WatchStream,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::LockError;

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

    fn count(&self) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        self.count();
        Ok(self.client.kv_client().txn(txn).await?)
    }

    /// Reads a key or range.
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, LockError> {
        self.count();
        Ok(self.client.kv_client().get(key, opts).await?)
    }

    /// Watches each of `keys` with `filters`, on one stream, from revision `from` on, or from
    /// the current revision on when `from` is `None`.
    ///
    /// Returns once etcd confirmed every watch, with the revision the watches start after:
    /// every change after it will be delivered. Watching from "now" rather than from a past
    /// revision keeps the watch on etcd's synced path; a watch that starts in the past waits for
    /// etcd's 100 ms catch-up loop, which is what makes etcd's own Mutex hand off slowly. Where
    /// that delay does not matter, `from` saves the read that would close the gap.
    pub async fn watch_keys(
        &self,
        keys: &[Vec<u8>],
        filters: &[WatchFilterType],
        from: Option<i64>,
    ) -> Result<KeyWatch, LockError> {
        let opts = || {
            let o = WatchOptions::new().with_filters(filters.to_vec());
            Some(match from {
                Some(rev) => o.with_start_revision(rev),
                None => o,
            })
        };
        let (first, rest) = keys
            .split_first()
            .ok_or_else(|| LockError::Invalid("nothing to watch".into()))?;
        let mut stream = self.client.watch_client().watch(first.clone(), opts()).await?;
        for key in rest {
            stream.watch(key.clone(), opts()).await?;
        }
        let mut watch = KeyWatch {
            stream,
            stats: self.stats.clone(),
            start_revision: 0,
            fired: false,
        };
        let mut created = 0;
        while created < keys.len() && !watch.fired {
            let resp = watch.next().await?;
            if resp.created() {
                created += 1;
                let rev = match from {
                    Some(from) => from - 1,
                    None => resp.header().map_or(0, |h| h.revision()),
                };
                watch.start_revision = watch.start_revision.max(rev);
            }
        }
        Ok(watch)
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
    async fn next(&mut self) -> Result<etcd_client::WatchResponse, LockError> {
        let resp = self
            .stream
            .message()
            .await?
            .ok_or_else(|| LockError::Unavailable("etcd closed the watch stream".into()))?;
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
