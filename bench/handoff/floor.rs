//! The floor: what one handoff physically costs on this etcd, measured in the same run. `n`
//! contenders in a ring, each with its own etcd client (as each pod has its own sidecar);
//! contender `i` waits for a put on its own key, then puts the next contender's key: one
//! committed write and one watch event to the next owner per handoff, nothing else (no queue,
//! no lease, no fencing, no release). No etcd lock can hand off faster than this.

use etcd_client::Client;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Handoffs per second around a ring of `n` contenders on `endpoint`, over `window`.
pub async fn handoffs_per_s(endpoint: &str, n: usize, window: Duration) -> f64 {
    let handoffs = Arc::new(AtomicU64::new(0));
    let key = |i: usize| format!("/floor/{n}/{}", i % n);
    let mut ring = vec![];
    for i in 0..n {
        let mut client = Client::connect([endpoint], None).await.unwrap();
        let mut stream = client.watch(key(i), None).await.unwrap();
        stream.message().await.unwrap(); // created: from here on no put is missed
        let (next, handoffs) = (key(i + 1), handoffs.clone());
        ring.push(tokio::spawn(async move {
            while let Ok(Some(response)) = stream.message().await {
                for _ in response.events() {
                    client.put(next.as_str(), "", None).await.unwrap();
                    handoffs.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut kick = Client::connect([endpoint], None).await.unwrap();
    kick.put(key(0), "", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // warm up
    let start = handoffs.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let counted = handoffs.load(Ordering::Relaxed) - start;
    for task in ring {
        task.abort();
    }
    counted as f64 / window.as_secs_f64()
}
