//! Queue keys that no sidecar tracks. While the workers run, once a second: every sidecar's
//! registry (`GET /v1/locks`), then every queue key in etcd. A key that no registry lists (a
//! hold with its token, or a wait of its lock and holder) is unknown; one that stays unknown
//! longer than [`ORPHAN_LIMIT`] would block its lock for good, and is a violation.
//!
//! A key is legitimately unknown for a while: its release or removal is on its way, its sidecar
//! was killed (the key goes with the lease, within the TTL, longer if a new etcd leader renews
//! the leases), or it is a late copy of an enqueue that the sidecar's sweep removes once two
//! sweeps 5 s apart found it. A sample is skipped when a sidecar or etcd does not answer
//! promptly (paused, killed, stalled): it says nothing either way.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::now;
use super::worker::Slot;

/// How long a key may stay unknown to every registry: two sweeps 5 s apart, and margin.
pub const ORPHAN_LIMIT: f64 = 15.0;

/// A queue key: its path and create revision.
type Key = (String, i64);

/// What the sampling saw.
#[derive(Debug, Default)]
pub struct Orphans {
    /// Samples taken, and those that said something (every sidecar and etcd answered).
    pub samples: (usize, usize),
    /// Each key found unknown, and for how long it stayed so (first to last such sample).
    pub unknown: HashMap<Key, f64>,
}

/// Samples once a second until `stop`: the registries of the sidecars in `slots`, and the queue
/// keys in the etcd at `endpoints`.
pub async fn sample(slots: Vec<Arc<Slot>>, endpoints: String, stop: CancellationToken) -> Orphans {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let etcd = etcd_client::Client::connect(endpoints.split(',').collect::<Vec<_>>(), None)
        .await
        .unwrap();
    let (mut seen, mut since) = (Orphans::default(), HashMap::<Key, f64>::new());
    while !stop.is_cancelled() {
        sleep(Duration::from_secs(1)).await;
        seen.samples.0 += 1;
        let Some(unknown) = unknown_keys(&http, &slots, etcd.clone()).await else {
            continue;
        };
        seen.samples.1 += 1;
        let t = now();
        since.retain(|k, _| unknown.contains(k));
        for k in unknown {
            let from = *since.entry(k.clone()).or_insert(t);
            let longest = seen.unknown.entry(k).or_default();
            *longest = longest.max(t - from);
        }
    }
    seen
}

impl Orphans {
    /// The keys that stayed unknown longer than [`ORPHAN_LIMIT`], in words.
    pub fn violations(&self) -> Vec<String> {
        (self.unknown.iter())
            .filter(|(_, d)| **d > ORPHAN_LIMIT)
            .map(|((key, rev), d)| format!("{key} (created at {rev}) unknown to every sidecar for {d:.1} s"))
            .collect()
    }

    /// One line for the report.
    pub fn summary(&self) -> String {
        let longest = self.unknown.values().copied().fold(0.0, f64::max);
        format!(
            "keys unknown to every sidecar: {} seen in {} of {} samples, longest {longest:.1} s \
             (limit {ORPHAN_LIMIT} s)",
            self.unknown.len(),
            self.samples.1,
            self.samples.0
        )
    }
}

/// The queue keys no registry lists, or `None` if a sidecar or etcd did not answer.
async fn unknown_keys(
    http: &reqwest::Client,
    slots: &[Arc<Slot>],
    mut etcd: etcd_client::Client,
) -> Option<Vec<Key>> {
    let mut entries = vec![];
    for slot in slots {
        let addr = slot.addr.lock().unwrap().clone();
        let locks: Value = http
            .get(format!("{addr}/v1/locks"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        entries.extend(locks["locks"].as_array()?.iter().cloned());
    }
    // Read after the registries: a key placed since is already listed as a wait.
    let opts = etcd_client::GetOptions::new().with_prefix();
    let read = etcd.get("/podlock/v1/queue/", Some(opts));
    let resp = timeout(Duration::from_millis(500), read).await.ok()?.ok()?;
    let keys = resp.kvs().iter().filter_map(|kv| {
        let key = String::from_utf8(kv.key().to_vec()).ok()?;
        Some((key, kv.create_revision())).filter(|(key, _)| !is_receipt(key))
    });
    Some(keys.filter(|k| !entries.iter().any(|e| lists(e, k))).collect())
}

/// How many contenders' keys etcd has (release receipts left out): 0 once every client is gone.
pub async fn contenders(etcd: &crate::common::EtcdServer) -> usize {
    let opts = etcd_client::GetOptions::new().with_prefix().with_keys_only();
    let Ok(resp) = etcd.client().await.get("/podlock/v1/queue/", Some(opts)).await else {
        return usize::MAX;
    };
    let keys = resp.kvs().iter().filter_map(|kv| kv.key_str().ok());
    keys.filter(|key| !is_receipt(key)).count()
}

/// Whether `key` is a release receipt (`.../queue/{namespace}/.released/...`, see
/// `src/lock/txn/receipt.rs`), which lies beside the queues and is no contender's key.
fn is_receipt(key: &str) -> bool {
    key.split('/').nth(5).is_some_and(|lock| lock.starts_with('.'))
}

/// Whether a registry entry is the one behind `key`: a hold with its token, or a wait of its
/// lock and holder (`.../queue/{namespace}/{lock}/{lease}/{holder}`).
fn lists(entry: &Value, (key, revision): &Key) -> bool {
    let parts: Vec<&str> = key.split('/').collect();
    let [.., lock, _lease, holder] = parts[..] else {
        return false;
    };
    entry["lock"] == lock
        && entry["holderId"] == holder
        && match entry["state"].as_str() {
            Some("held") => entry["fencingToken"].as_i64() == Some(*revision),
            _ => true,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_is_known_by_its_hold_with_its_token_or_by_its_wait() {
        let key = (
            "/podlock/v1/queue/default/pool/00000000000000ff/w3".to_string(),
            42,
        );
        let held =
            |token: i64| json!({"lock": "pool", "holderId": "w3", "state": "held", "fencingToken": token});
        assert!(lists(&held(42), &key));
        // The same holder's newer hold does not vouch for an older key left behind.
        assert!(!lists(&held(57), &key));
        assert!(lists(
            &json!({"lock": "pool", "holderId": "w3", "state": "waiting"}),
            &key
        ));
        assert!(!lists(
            &json!({"lock": "counter", "holderId": "w3", "state": "waiting"}),
            &key
        ));
    }

    #[test]
    fn a_release_receipt_is_no_contenders_key() {
        assert!(is_receipt(
            "/podlock/v1/queue/safety/.released/rw/47c3a21efa52e7c1"
        ));
        assert!(!is_receipt("/podlock/v1/queue/safety/rw/47c3a21efa52e7c1/w1"));
    }

    #[test]
    fn only_a_key_unknown_past_the_limit_is_a_violation() {
        let mut seen = Orphans::default();
        seen.unknown.insert(("/k/a".into(), 1), 2.0);
        assert!(seen.violations().is_empty());
        seen.unknown.insert(("/k/b".into(), 2), ORPHAN_LIMIT + 1.0);
        assert_eq!(seen.violations().len(), 1);
    }
}
