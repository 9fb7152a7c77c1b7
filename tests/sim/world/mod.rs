//! The seeded world (#54, item 3, a first cut): podlock's own engine, several sidecars of it,
//! against the simulated etcd on one current-thread runtime with paused time, every choice
//! drawn from one seed, checked online (`check.rs`) and at the end (`seed.rs`). A seed's trace
//! (a line per step) is hashed; some seeds run twice and their hashes must agree. See
//! docs/design.md, "The seeded world".

mod check;
mod client;
mod faults;
mod logs;
mod net;
pub mod scenes;
mod seed;
mod shared;

use podlock_sim::etcd::{Config, Etcd};
use shared::World;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// The namespace of every lock and pod.
const NAMESPACE: &str = "sim";

/// A lock of the world, as declared.
struct LockSpec {
    name: &'static str,
    max_holders: u32,
    heartbeat: u32,
    /// Clients may ask for shared holds (a reader-writer lock: `maxHolders` 1).
    shared: bool,
}

/// A reader-writer lock, then a semaphore whose `maxHolders` the operator changes.
const LOCKS: [LockSpec; 2] = [
    LockSpec {
        name: "rw",
        max_holders: 1,
        heartbeat: 0,
        shared: true,
    },
    LockSpec {
        name: "sem",
        max_holders: 2,
        heartbeat: 3,
        shared: false,
    },
];

/// Seeds that found a bug in the engine, kept out of the default run until it is fixed;
/// `PODLOCK_WORLD_KNOWN=1` replays them (docs/design.md, "The seeded world").
const KNOWN: &[u64] = &[];

/// Why two runs of a seed may differ in a build without `--cfg tokio_unstable`.
const UNSEEDED: &str = " (a difference fails only when built with RUSTFLAGS=\"--cfg tokio_unstable\": \
    without it Tokio draws select! branches and watch wake-ups from a generator no seed reaches)";

/// Lines of a failing seed's trace printed.
const TAIL: usize = 30;

/// What a seed did.
struct Outcome {
    trace: Vec<String>,
    failure: Option<String>,
    checks: u64,
    faults: BTreeMap<&'static str, u64>,
}

impl Outcome {
    fn hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.trace.hash(&mut h);
        h.finish()
    }
}

/// Runs `PODLOCK_WORLD_SEEDS` seeds (default 32) from `PODLOCK_WORLD_SEED` (default 1), or
/// with `PODLOCK_WORLD_KNOWN=1` the seeds of `KNOWN`, the first `PODLOCK_WORLD_TWICE` (default
/// 2) of them twice; the first that breaks a rule fails the test with the command that
/// replays it and the end of its trace, and so does one that runs otherwise the second time
/// in a build with `--cfg tokio_unstable` (without it, Tokio's own choices are not seeded).
/// `PODLOCK_WORLD_TRACE=1` prints every seed's whole trace.
pub fn run() -> Result<(), String> {
    let seeds: Vec<u64> = if std::env::var("PODLOCK_WORLD_KNOWN").is_ok_and(|v| v == "1") {
        KNOWN.to_vec()
    } else {
        let first = super::env("PODLOCK_WORLD_SEED", 1);
        (first..first + super::env("PODLOCK_WORLD_SEEDS", 32)).collect()
    };
    let twice = super::env("PODLOCK_WORLD_TWICE", 2).min(seeds.len() as u64);
    let show = std::env::var("PODLOCK_WORLD_TRACE").is_ok_and(|v| v == "1");
    let started = Instant::now();
    let (mut checks, mut faults, mut alike) = (0, BTreeMap::new(), 0);
    for (i, &seed) in seeds.iter().enumerate() {
        let out = run_seed(seed);
        if show {
            println!("sim world: seed {seed}'s trace:\n{}", out.trace.join("\n"));
        }
        if let Some(failure) = &out.failure {
            return Err(report(seed, failure, &out.trace));
        }
        if (i as u64) < twice && replays(seed, &out)? {
            alike += 1;
        }
        checks += out.checks;
        for (k, n) in out.faults {
            *faults.entry(k).or_insert(0) += n;
        }
    }
    let (n, secs) = (seeds.len(), started.elapsed().as_secs_f64());
    println!(
        "sim world: {n} seeds in {secs:.1} s ({:.2} seeds/s): {checks} checks, faults {faults:?}; \
         {alike} of {twice} seeds run twice ran alike{}",
        n as f64 / secs,
        if cfg!(tokio_unstable) { "" } else { UNSEEDED }
    );
    Ok(())
}

/// Runs `seed` again: whether it ran as `first` did. A difference fails only where Tokio's
/// choices are seeded too.
fn replays(seed: u64, first: &Outcome) -> Result<bool, String> {
    let again = run_seed(seed);
    if again.hash() == first.hash() {
        return Ok(true);
    }
    if cfg!(tokio_unstable) {
        let lines = diverged(&first.trace, &again.trace);
        return Err(report(seed, "two runs of the seed differ", &lines));
    }
    Ok(false)
}

fn run_seed(seed: u64) -> Outcome {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // Which branch of an unbiased `select!` Tokio polls first is drawn from the runtime's
    // generator, which only `--cfg tokio_unstable` lets a seed set.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let runtime = builder.build().expect("a Tokio runtime");
    // The engine's retry pauses (`src/retry.rs`, backon's jitter) come from this thread's
    // `fastrand` generator.
    fastrand::seed(seed);
    runtime.block_on(async {
        let etcd = Arc::new(Etcd::start(Config::default()));
        let world = World::new(etcd.clone());
        let _logs = logs::capture(&world);
        seed::run(seed, &world, etcd).await;
        world.with(|s| Outcome {
            trace: std::mem::take(&mut s.trace),
            failure: s.failure.take(),
            checks: s.check.checks,
            faults: std::mem::take(&mut s.faults),
        })
    })
}

/// The command that replays `seed`, and the trace's last lines up to the first broken rule.
fn report(seed: u64, failure: &str, trace: &[String]) -> String {
    let end = trace
        .iter()
        .position(|l| l.contains(" BROKEN "))
        .map_or(trace.len(), |i| i + 1);
    let tail = &trace[end.saturating_sub(TAIL)..end];
    format!(
        "sim world: seed {seed}: {failure}\nreplay: PODLOCK_SIM_PART=world PODLOCK_WORLD_SEED={seed} \
         PODLOCK_WORLD_SEEDS=1 cargo test --test sim\nthe trace's last {} lines:\n{}",
        tail.len(),
        tail.join("\n")
    )
}

/// The two traces from a little before the first line where they part.
fn diverged(a: &[String], b: &[String]) -> Vec<String> {
    let n = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let from = n.saturating_sub(10);
    let mut lines: Vec<String> = a[from..a.len().min(n + 5)]
        .iter()
        .map(|l| format!("first:  {l}"))
        .collect();
    lines.extend(b[from..b.len().min(n + 5)].iter().map(|l| format!("second: {l}")));
    lines
}
