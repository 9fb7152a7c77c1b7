//! The floors: what one handoff physically costs on this etcd, measured in the same run. `n`
//! contenders in a ring, each with its own etcd client (as each pod has its own sidecar);
//! contender `i` waits for a put on its own turn key, then puts the next contender's: one
//! committed write and one watch event to the next owner per handoff, nothing else (no queue,
//! no lease, no fencing, no release). No etcd lock can hand off faster than this.
//!
//! A lock that enqueues each request also writes the request's queue key before it can be
//! granted: [`Floor::TwoWrites`] adds it. Each contender puts its own queue key (watched by
//! nobody) before it waits for its turn, so each handoff is exactly 2 committed writes (the
//! next one's turn, the holder's next queue key) and 1 watch event. As a lock's contender
//! enqueues again right after its release, the queue write overlaps the next handoffs; with few
//! contenders it delays the holder's next turn.

use etcd_client::Client;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The writes a floor makes per handoff, each with one watch event.
#[derive(Clone, Copy, PartialEq)]
pub enum Floor {
    /// The next one's turn: what a handoff physically costs.
    OneWrite,
    /// The next one's turn and the holder's queue key for its next turn: what a lock that
    /// enqueues each request pays.
    TwoWrites,
}

/// Handoffs per second around a ring of `n` contenders on `endpoint`, over `window`.
pub async fn handoffs_per_s(endpoint: &str, n: usize, window: Duration, floor: Floor) -> f64 {
    let handoffs = Arc::new(AtomicU64::new(0));
    let name = match floor {
        Floor::OneWrite => "floor",
        Floor::TwoWrites => "floor2",
    };
    let turn = |i: usize| format!("/{name}/{n}/turn/{}", i % n);
    let mut ring = vec![];
    for i in 0..n {
        let mut client = Client::connect([endpoint], None).await.unwrap();
        let mut stream = client.watch(turn(i), None).await.unwrap();
        stream.message().await.unwrap(); // created: from here on no put is missed
        let (next, handoffs) = (turn(i + 1), handoffs.clone());
        let queue = format!("/{name}/{n}/queue/{i}");
        ring.push(tokio::spawn(async move {
            let enqueue = async |client: &mut Client| {
                if floor == Floor::TwoWrites {
                    client.put(queue.as_str(), "", None).await.unwrap();
                }
            };
            enqueue(&mut client).await;
            while let Ok(Some(response)) = stream.message().await {
                for _ in response.events() {
                    client.put(next.as_str(), "", None).await.unwrap();
                    handoffs.fetch_add(1, Ordering::Relaxed);
                    enqueue(&mut client).await;
                }
            }
        }));
    }
    let mut kick = Client::connect([endpoint], None).await.unwrap();
    kick.put(turn(0), "", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // warm up
    let start = handoffs.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let counted = handoffs.load(Ordering::Relaxed) - start;
    for task in ring {
        task.abort();
    }
    counted as f64 / window.as_secs_f64()
}
