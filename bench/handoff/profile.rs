//! `--podlock-only CONTENDERS SECONDS`: podlock alone, for a profiler to watch
//! (`scripts/profile-handoff.sh`): the handoff rate, the waits' distribution, the gaps
//! between grants, where a stall of the whole queue shows, and the sidecars' CPU per grant.
//! `--floor-only CONTENDERS SECONDS`: the 2-writes floor alone, for the same profiler
//! (`scripts/profile-etcd.sh` sets one beside the other).

use std::time::Duration;

use crate::common::{EtcdServer, declare, usage};
use crate::floor::{Floor, ring};
use crate::measure::{EtcdWork, Podlock, contended, warm_up};

/// `--podlock-only N SECONDS`: podlock alone, `n` contenders for `window`, for a profiler to
/// watch (`scripts/profile-handoff.sh`, `scripts/profile-etcd.sh`); prints the rate, the CPU
/// and etcd work per grant, the waits and the gaps between grants.
pub async fn podlock_only(n: usize, window: Duration) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["profiled"]);
    let cs = Podlock::contenders(&etcd, "profiled", n).await;
    warm_up(&cs).await;
    println!(
        "podlock, {n} contenders, etcd pid {}: running for {window:?}",
        etcd.pid()
    );
    let sidecars_cpu = || cs.iter().map(|c| usage(c.sidecar.pid()).1).sum::<f64>();
    let (cpu, work) = (sidecars_cpu(), EtcdWork::of(&cs).await);
    let r = contended(&cs, window).await;
    let cpu = sidecars_cpu() - cpu;
    let work = EtcdWork::of(&cs).await.minus(&work);
    let mean = Duration::from_secs_f64(1.0 / r.handoffs_per_s.max(1e-9));
    println!(
        "handoffs/s {:.0}, mean handoff {:.2} ms, p99 wait {:.1} ms (FIFO predicts about {:.1} ms: {n} handoffs)",
        r.handoffs_per_s,
        mean.as_secs_f64() * 1000.0,
        r.p99_wait.as_secs_f64() * 1000.0,
        mean.as_secs_f64() * 1000.0 * n as f64
    );
    println!(
        "sidecars' CPU s per 1,000 grants {:.2} ({cpu:.2} s over {} grants)",
        1000.0 * cpu / r.grants.max(1) as f64,
        r.grants
    );
    let [requests, watches, events] = work.per_grant(r.grants as f64);
    println!(
        "etcd requests / watches created / watch events per grant: {requests:.3} / {watches:.3} / {events:.3}"
    );
    let quantiles = quantiles(&r.waits, &[0.5, 0.9, 0.99, 0.999, 1.0]);
    println!("waits over {} grants: {quantiles}", r.waits.len());
    let slow = |ms: u64| {
        r.waits
            .iter()
            .filter(|w| **w >= Duration::from_millis(ms))
            .count()
    };
    let buckets = [20, 30, 50, 100, 200].map(|ms| format!(">= {ms} ms: {}", slow(ms)));
    println!("slow waits: {}", buckets.join(", "));
    print_gaps(&r.grants_at);
}

/// `--floor-only N SECONDS`: the 2-writes floor's ring of `n` contenders alone for `window`, for
/// a profiler to watch (`scripts/profile-etcd.sh`); prints its rate and etcd's CPU.
pub async fn floor_only(n: usize, window: Duration) {
    let etcd = EtcdServer::start().await;
    println!(
        "floor (2 writes), {n} contenders, etcd pid {}: running for {window:?}",
        etcd.pid()
    );
    let r = ring(&etcd.endpoint, etcd.pid(), n, window, Floor::TwoWrites).await;
    println!(
        "handoffs/s {:.0}; etcd's CPU s per 1,000 handoffs {:.2}, the ring's {:.2}",
        r.rate, r.etcd_cpu, r.client_cpu
    );
}

/// The time between consecutive grants: a stall of the whole lock (every waiter's wait grows by
/// it) shows as a long gap, a waiter served out of turn does not.
fn print_gaps(grants_at: &[Duration]) {
    let mut gaps: Vec<(Duration, Duration)> = (grants_at.windows(2)).map(|w| (w[1] - w[0], w[1])).collect();
    gaps.sort();
    let Some(&(longest, _)) = gaps.last() else {
        return;
    };
    let sorted: Vec<Duration> = gaps.iter().map(|g| g.0).collect();
    let long = |ms: u64| gaps.iter().filter(|g| g.0 >= Duration::from_millis(ms)).count();
    println!(
        "gaps between grants: {}, longest {:.1} ms; >= 10 ms: {}, >= 30 ms: {}",
        quantiles(&sorted, &[0.5, 0.9, 0.99, 0.999]),
        longest.as_secs_f64() * 1000.0,
        long(10),
        long(30)
    );
    let worst: Vec<_> = (gaps.iter().rev().take(8))
        .map(|(g, t)| {
            format!(
                "{:.1} ms ending at {:.3} s",
                g.as_secs_f64() * 1000.0,
                t.as_secs_f64()
            )
        })
        .collect();
    println!("longest gaps: {}", worst.join("; "));
}

/// `sorted`'s value at each of `ps`, as "p: x ms, ...".
fn quantiles(sorted: &[Duration], ps: &[f64]) -> String {
    let at = |p: f64| sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)];
    let each: Vec<_> = (ps.iter())
        .map(|&p| format!("{p}: {:.1} ms", at(p).as_secs_f64() * 1000.0))
        .collect();
    each.join(", ")
}
