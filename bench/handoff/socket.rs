//! `--unix-socket CYCLES ROUNDS`: whether a Unix socket makes the sidecar's HTTP hop cheaper
//! (issue #43 item 3). One sidecar serves its API on TCP loopback and on a Unix socket
//! (`--listen-unix`); the same client takes uncontended acquire+release cycles over each in
//! turn, round after round, so that the machine's drift hits both alike.

use std::time::Duration;

use crate::common::{EtcdServer, Sidecar, declare, usage};
use crate::measure::{Podlock, uncontended};

/// Prints, for TCP and for the Unix socket, the median over `rounds` of each round's p50 and p99
/// cycle and cycles per second, and the sidecar's CPU per 1,000 cycles over each.
pub async fn compare(cycles: usize, rounds: usize) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["solo"]);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("podlock.sock");
    let flag = ["--listen-unix", path.to_str().expect("a UTF-8 path")];
    let sidecar = Sidecar::start(&etcd.endpoint, "bench-socket", &flag).await;
    let pid = sidecar.pid();
    let mut client = Podlock::on(sidecar, "solo");
    let mut results: [Vec<[f64; 4]>; 2] = [vec![], vec![]];
    for _ in 0..rounds {
        for (i, over) in [None, Some(path.as_path())].into_iter().enumerate() {
            client.use_unix_socket(over);
            let cpu = usage(pid).1;
            let (p50, p99, rate) = uncontended(&client, cycles).await;
            let cpu = (usage(pid).1 - cpu) * 1000.0 / (cycles + cycles / 10) as f64;
            results[i].push([ms(p50), ms(p99), rate, cpu]);
        }
    }
    println!("| sidecar reached over | cycle p50 | cycle p99 | cycles/s | sidecar CPU s per 1,000 cycles |");
    println!("|---|---|---|---|---|");
    for (name, rounds) in ["TCP loopback", "Unix socket"].iter().zip(&results) {
        let [p50, p99, rate, cpu] = [0, 1, 2, 3].map(|k| median(rounds.iter().map(|r| r[k])));
        println!("| {name} | {p50:.3} ms | {p99:.3} ms | {rate:.0} | {cpu:.3} |");
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
