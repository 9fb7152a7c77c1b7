//! Watches of single pods, by name, for pods that hold or wait but do not carry the sidecar
//! label (a sidecar written into the manifest by hand, or a pod created while the webhook was
//! down). The operator's main pod watch selects on the label so that it never watches every
//! pod of the cluster; these watches cover the rest, one pod each, for as long as the pod has
//! queue entries.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::etcd_watch::PodKey;

/// What a single-pod watch reports.
pub enum Seen {
    /// The pod as it is now.
    Pod(Box<Pod>),
    /// The pod was deleted.
    Deleted(Box<Pod>),
    /// The watch has listed the pod's name (found or not): read it to know which.
    Listed(PodKey),
}

/// The single-pod watches, each reporting into one channel.
pub struct NamedPods {
    client: kube::Client,
    watches: HashMap<PodKey, JoinHandle<()>>,
    seen: mpsc::Sender<Seen>,
}

impl NamedPods {
    /// No watches yet; each will report into `seen`.
    pub fn new(client: kube::Client, seen: mpsc::Sender<Seen>) -> Self {
        NamedPods {
            client,
            watches: HashMap::new(),
            seen,
        }
    }

    /// Watches `pod` unless it is watched already.
    pub fn watch(&mut self, pod: &PodKey) {
        if self.watches.contains_key(pod) {
            return;
        }
        info!(
            pod = pod.1,
            namespace = pod.0,
            "watching an unlabelled pod that holds or waits"
        );
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.0);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", pod.1));
        let (seen, key) = (self.seen.clone(), pod.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            while let Some(event) = events.next().await {
                let report = match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => Seen::Pod(p.into()),
                    Ok(watcher::Event::Delete(p)) => Seen::Deleted(p.into()),
                    Ok(watcher::Event::InitDone) => Seen::Listed(key.clone()),
                    Ok(watcher::Event::Init) => continue,
                    Err(e) => {
                        warn!(pod = key.1, namespace = key.0, error = %e, "pod watch failed; retrying");
                        continue;
                    }
                };
                if seen.send(report).await.is_err() {
                    return;
                }
            }
        });
        self.watches.insert(pod.clone(), task);
    }

    /// Ends the watches of pods for which `keep` is false (no entries left).
    pub fn retain(&mut self, keep: impl Fn(&PodKey) -> bool) {
        self.watches.retain(|pod, task| {
            let kept = keep(pod);
            if !kept {
                task.abort();
            }
            kept
        });
    }
}

impl Drop for NamedPods {
    fn drop(&mut self) {
        self.retain(|_| false);
    }
}
