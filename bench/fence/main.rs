//! Benchmark: what a fence check costs (`GET /v1/locks/{name}/fence`, issue #29 item 2).
//!
//! `cargo bench --bench fence` (add `-- --quick` for a smoke run) checks a held mutex's token
//! over and over, one request at a time, through one sidecar on one local etcd: checks per
//! second, latency p50 and p99, and etcd requests per check (the sidecar's own counter); the
//! same with 32 waiters queued behind the holder (the check reads the queue's head only); and,
//! as the floor, the same linearizable etcd read of the queue's head sent straight from an etcd
//! client in this process, without HTTP and the sidecar. It writes bench/results/fence.md (a
//! quick run: fence-quick.md) and refreshes bench/README.md's quote of it.

#[path = "../../tests/common/mod.rs"]
mod common;

use etcd_client::{GetOptions, SortOrder, SortTarget};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{EtcdServer, Sidecar, declare, percentile, results, wait_until};

/// The lock checked.
const LOCK: &str = "fenced";

/// Waiters queued behind the holder in the second run.
const WAITERS: usize = 32;

/// The keys of the queue's head the check reads for a mutex (its slots and 8 more).
const HEAD: i64 = 9;

/// What one run measured.
struct Measured {
    /// Checks (or reads) done.
    count: usize,
    window: Duration,
    latencies: Vec<Duration>,
    /// etcd requests the sidecar sent per check; `None` for the floor.
    requests: Option<f64>,
}

impl Measured {
    fn row(mut self, what: &str) -> String {
        let rate = self.count as f64 / self.window.as_secs_f64();
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
        let (p50, p99) = (
            percentile(&mut self.latencies, 0.5),
            percentile(&mut self.latencies, 0.99),
        );
        let requests = self.requests.map_or("—".into(), |r| format!("{r:.2}"));
        format!("| {what} | {rate:.0} | {} | {} | {requests} |", ms(p50), ms(p99))
    }
}

/// Runs `once` back to back for `window`; its latencies.
async fn back_to_back<F: std::future::Future<Output = ()>>(
    window: Duration,
    mut once: impl FnMut() -> F,
) -> (usize, Vec<Duration>) {
    let mut latencies = vec![];
    let stop = Instant::now() + window;
    while Instant::now() < stop {
        let t = Instant::now();
        once().await;
        latencies.push(t.elapsed());
    }
    (latencies.len(), latencies)
}

/// Fence checks of `token`, one at a time over one keep-alive connection, for `window`.
async fn checks(s: &Sidecar, token: i64, window: Duration) -> Measured {
    let http = reqwest::Client::new();
    let url = format!("{}/v1/locks/{LOCK}/fence?token={token}", s.addr);
    let check = || async {
        let answer: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        assert_eq!(answer["current"], true, "{answer}");
    };
    for _ in 0..50 {
        check().await; // warm up
    }
    let before = s.metric("podlock_etcd_requests_total").await;
    let (count, latencies) = back_to_back(window, check).await;
    let sent = s.metric("podlock_etcd_requests_total").await - before;
    Measured {
        count,
        window,
        latencies,
        requests: Some(sent / count as f64),
    }
}

/// The floor: the check's etcd read (the queue's head, linearizable) straight from a client.
async fn floor(endpoint: &str, window: Duration) -> Measured {
    let client = etcd_client::Client::connect([endpoint], None).await.unwrap();
    let prefix = format!("/podlock/v1/queue/default/{LOCK}/");
    let head = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(HEAD);
    let mut read = || {
        let (mut kv, prefix, head) = (client.kv_client(), prefix.clone(), head.clone());
        async move {
            let resp = kv.get(prefix, Some(head)).await.unwrap();
            assert!(!resp.kvs().is_empty(), "the holder's key");
        }
    };
    for _ in 0..50 {
        read().await;
    }
    let (count, latencies) = back_to_back(window, &mut read).await;
    Measured {
        count,
        window,
        latencies,
        requests: None,
    }
}

/// Queues [`WAITERS`] waiters behind the holder, from the same sidecar; returns once all wait.
async fn queue_waiters(s: &Arc<Sidecar>) -> Vec<tokio::task::JoinHandle<()>> {
    let waiters = (0..WAITERS)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let body = json!({"holderId": format!("w{i}"), "waitSeconds": 600});
                s.post(LOCK, "acquire", body).await;
            })
        })
        .collect();
    wait_until(Duration::from_secs(30), || async {
        s.get(&format!("/v1/locks/{LOCK}")).await.1["waiters"] == WAITERS
    })
    .await
    .expect("the waiters queued");
    waiters
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let window = Duration::from_secs(if quick { 1 } else { 5 });
    let machine = results::machine();
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[LOCK]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let token = s.must_acquire(LOCK, json!({"holderId": "holder"})).await;
    let mut rows = vec![
        checks(&s, token, window)
            .await
            .row("fence check over HTTP, mutex held, no waiters"),
    ];
    rows.push(floor(&etcd.endpoint, window).await.row(
        "floor: the same etcd read of the queue's head, straight from an etcd client (no HTTP, no sidecar)",
    ));
    let waiters = queue_waiters(&s).await;
    let queued = format!("fence check over HTTP, mutex held, {WAITERS} waiters queued");
    rows.push(checks(&s, token, window).await.row(&queued));
    for w in waiters {
        w.abort();
    }
    let table = format!(
        "| measurement | checks/s | latency p50 | latency p99 | etcd requests per check |\n|---|---|---|---|---|\n{}",
        rows.join("\n")
    );
    let setup = format!(
        "one local etcd, one sidecar; one request at a time over a keep-alive connection, {window:?} per row"
    );
    println!("machine: {machine}; {setup}\n\n{table}");
    let run = results::Run {
        bench: "fence",
        quick,
        machine,
        setup,
        blocks: vec![("table", "Fence checks, one at a time, and the floor.", table)],
    };
    println!("\nwritten: {}", run.write());
}
