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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podlock::critical_path::monotonic_ns;

use crate::common::usage;

/// The writes a floor makes per handoff, each with one watch event.
#[derive(Clone, Copy, PartialEq)]
pub enum Floor {
    /// The next one's turn: what a handoff physically costs.
    OneWrite,
    /// The next one's turn and the holder's queue key for its next turn: what a lock that
    /// enqueues each request pays.
    TwoWrites,
}

/// What a ring run measured.
pub struct Ring {
    /// Handoffs per second.
    pub rate: f64,
    /// CPU seconds per 1,000 handoffs of the contenders (this process, which runs nothing else
    /// meanwhile) and of etcd.
    pub client_cpu: f64,
    pub etcd_cpu: f64,
    /// Per handoff after the warm-up, in nanoseconds: from a contender's watch event to the
    /// next one's (its put of the next turn, etcd's commit and watch event, loopback).
    pub hops: Vec<i64>,
}

/// When one contender had each of its turns' watch events ([`monotonic_ns`]).
type Turns = Arc<Mutex<Vec<i64>>>;

/// Runs a ring of `n` contenders on the etcd at `endpoint` (process `etcd`) for `window`:
/// handoffs per second, their CPU, and each handoff's time (see [`Ring`]).
pub async fn ring(endpoint: &str, etcd: i32, n: usize, window: Duration, floor: Floor) -> Ring {
    let handoffs = Arc::new(AtomicU64::new(0));
    let name = match floor {
        Floor::OneWrite => "floor",
        Floor::TwoWrites => "floor2",
    };
    let turn = |i: usize| format!("/{name}/{n}/turn/{}", i % n);
    let (mut ring, mut turns) = (vec![], vec![]);
    for i in 0..n {
        let mut client = Client::connect([endpoint], None).await.unwrap();
        let mut stream = client.watch(turn(i), None).await.unwrap();
        stream.message().await.unwrap(); // created: from here on no put is missed
        let (next, handoffs) = (turn(i + 1), handoffs.clone());
        let queue = format!("/{name}/{n}/queue/{i}");
        let mine: Turns = Arc::default();
        turns.push(mine.clone());
        ring.push(tokio::spawn(async move {
            let enqueue = async |client: &mut Client| {
                if floor == Floor::TwoWrites {
                    client.put(queue.as_str(), "", None).await.unwrap();
                }
            };
            enqueue(&mut client).await;
            while let Ok(Some(response)) = stream.message().await {
                for _ in response.events() {
                    mine.lock().unwrap().push(monotonic_ns());
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
    let cpu = || (usage(std::process::id() as i32).1, usage(etcd).1);
    let (start, from, (client, server)) = (handoffs.load(Ordering::Relaxed), monotonic_ns(), cpu());
    tokio::time::sleep(window).await;
    let counted = handoffs.load(Ordering::Relaxed) - start;
    let (client_end, server_end) = cpu();
    for task in ring {
        task.abort();
    }
    let per = |cpu: f64| 1000.0 * cpu / (counted.max(1) as f64);
    Ring {
        rate: counted as f64 / window.as_secs_f64(),
        client_cpu: per(client_end - client),
        etcd_cpu: per(server_end - server),
        hops: hops(&turns, from),
    }
}

/// Each handoff's time from `from` on: contender `i`'s turn `j` leads to contender `i + 1`'s
/// turn `j` (contender 0's first turn was the kick, so its turns lag one behind).
fn hops(turns: &[Turns], from: i64) -> Vec<i64> {
    let turns: Vec<Vec<i64>> = turns.iter().map(|t| t.lock().unwrap().clone()).collect();
    let n = turns.len();
    let mut out = vec![];
    for (i, mine) in turns.iter().enumerate() {
        let lag = usize::from(i + 1 == n);
        let next = &turns[(i + 1) % n];
        let pairs = mine.iter().zip(next.iter().skip(lag));
        out.extend(pairs.filter(|(at, _)| **at >= from).map(|(at, then)| then - at));
    }
    out
}
