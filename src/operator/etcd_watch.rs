//! Turns etcd changes under `/podlock/v1/` into reconcile requests, so that status follows etcd
//! within a second without polling. A broken watch is re-established from "now", followed by a
//! reconcile of every lock, so nothing that happened in between is missed.

use etcd_client::WatchOptions;
use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::warn;

use crate::crd::DistributedLock;
use crate::lock::etcd::Etcd;
use crate::lock::keys;

/// The lock a podlock key belongs to: `(namespace, name)`.
pub fn lock_of_key(key: &[u8]) -> Option<(String, String)> {
    let key = std::str::from_utf8(key).ok()?;
    let rest = key.strip_prefix("/podlock/v1/")?;
    let mut parts = rest.split('/');
    match (parts.next()?, parts.next(), parts.next()) {
        ("config" | "queue", Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => {
            Some((ns.to_string(), name.to_string()))
        }
        _ => None,
    }
}

/// Two streams: the lock of every etcd change, and a tick whenever every lock must be
/// reconciled (after the watch broke and was re-established).
/// With `namespace`, only that namespace's locks are watched.
pub fn triggers(
    etcd: Etcd,
    namespace: Option<&str>,
) -> (
    impl Stream<Item = ObjectRef<DistributedLock>> + use<>,
    impl Stream<Item = ()> + use<>,
) {
    let prefixes = [keys::config_prefix(namespace), keys::queue_root(namespace)];
    let (changed, changed_rx) = mpsc::channel(1024);
    let (all, all_rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut first = true;
        loop {
            if !first {
                let _ = all.try_send(());
            }
            first = false;
            let mut stream = match watch_prefixes(&etcd, &prefixes).await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "cannot watch etcd; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        for ev in resp.events() {
                            let Some((ns, name)) = ev.kv().and_then(|kv| lock_of_key(kv.key())) else {
                                continue;
                            };
                            if changed.send(ObjectRef::new(&name).within(&ns)).await.is_err() {
                                return;
                            }
                        }
                        if resp.canceled() {
                            warn!(
                                reason = resp.cancel_reason(),
                                "etcd cancelled the watch; re-watching"
                            );
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        warn!(error = %e, "etcd watch broke; re-watching");
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (ReceiverStream::new(changed_rx), ReceiverStream::new(all_rx))
}

/// One watch stream over every prefix, from now on.
async fn watch_prefixes(
    etcd: &Etcd,
    prefixes: &[String],
) -> Result<etcd_client::WatchStream, etcd_client::Error> {
    let opts = || Some(WatchOptions::new().with_prefix());
    let mut stream = etcd
        .client()
        .watch_client()
        .watch(prefixes[0].as_str(), opts())
        .await?;
    for p in &prefixes[1..] {
        stream.watch(p.as_str(), opts()).await?;
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_their_lock() {
        let lock = |k: &str| lock_of_key(k.as_bytes());
        assert_eq!(lock("/podlock/v1/config/ns/a"), Some(("ns".into(), "a".into())));
        assert_eq!(
            lock("/podlock/v1/queue/ns/a/00ff/h"),
            Some(("ns".into(), "a".into()))
        );
        assert_eq!(lock("/podlock/v1/queue/ns"), None);
        assert_eq!(lock("/other/v1/config/ns/a"), None);
    }
}
