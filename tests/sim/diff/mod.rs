//! The simulated etcd against a real one: the same seeded requests to both, every answer,
//! error and watch event compared, revisions included.

mod apply;
mod faults;
mod replay;
mod requests;
mod watches;

use crate::common::EtcdServer;
use crate::env;
use etcd_client::Client;
use podlock_sim::etcd::{Config, Etcd};
use requests::{Known, Rng, Step};
use std::time::{Duration, Instant};
use watches::Streams;

/// Watch streams per side.
const STREAMS: usize = 3;
/// Steps between two watch barriers.
const BARRIER_EVERY: usize = 25;
/// How long a lease granted below the smallest TTL (2 s) takes to be gone from both etcds:
/// etcd's leader looks for expired leases every 500 ms.
const EXPIRY_WAIT: Duration = Duration::from_millis(3_000);

/// What a passing sequence compared.
#[derive(Default)]
struct Counts {
    requests: usize,
    events: usize,
}

/// Checks replay on paused time with seed `PODLOCK_SIM_SEED` (default 1) and the simulated
/// faults, then runs
/// `PODLOCK_SIM_SEQUENCES` sequences (default 6) of `PODLOCK_SIM_STEPS` steps (default 200)
/// against a real etcd, seeds from `PODLOCK_SIM_SEED` on; the first that differs fails the test.
pub fn run() -> Result<(), String> {
    let sequences = env("PODLOCK_SIM_SEQUENCES", 6);
    let steps = env("PODLOCK_SIM_STEPS", 200) as usize;
    let first = env("PODLOCK_SIM_SEED", 1);
    println!("{}", replay::check(first, steps)?);
    println!("{}", faults::check()?);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let started = Instant::now();
    let mut total = Counts::default();
    for seed in first..first + sequences {
        let c = runtime
            .as_ref()
            .expect("a Tokio runtime")
            .block_on(sequence(seed, steps))?;
        total.requests += c.requests;
        total.events += c.events;
    }
    println!(
        "sim: the simulated etcd agreed with etcd {} on {} sequences (seeds {first}..={}): {} requests \
         and {} watch events compared, in {:.1} s",
        etcd_version(),
        sequences,
        first + sequences - 1,
        total.requests,
        total.events,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn etcd_version() -> String {
    let out = std::process::Command::new(crate::common::bin_dir().join("etcd"))
        .arg("--version")
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or("?")
        .to_string()
}

/// One etcd under test: a client, its watch streams, every answer it gave.
pub struct Side {
    name: &'static str,
    client: Client,
    streams: Streams,
    /// Every answer, in order (the paused-time replay compares two runs' transcripts).
    pub answers: Vec<apply::Outcome>,
}

impl Side {
    pub async fn new(name: &'static str, mut client: Client) -> Self {
        let streams = Streams::open(name, &mut client, STREAMS).await;
        Side {
            name,
            client,
            streams,
            answers: Vec::new(),
        }
    }
}

/// Sends the `steps` steps of `seed` to every side, the simulated etcd `sim` first; the first
/// answer on which two sides differ is an error. Ends with every watch caught up and read.
pub async fn drive(seed: u64, steps: usize, sim: &Etcd, sides: &mut [Side]) -> Result<usize, String> {
    let mut rng = Rng::new(seed);
    for i in 0..steps {
        let known = sim.inspect(|s| Known {
            revision: s.store.revision(),
            compacted: s.store.compacted(),
            streams: STREAMS,
        });
        let step = requests::step(&mut rng, &known);
        let settles = matches!(step, Step::Compact { .. } | Step::Cancel { .. });
        if settles || i % BARRIER_EVERY == BARRIER_EVERY - 1 {
            // etcd catches a watch from a past revision up within 100 ms, the simulated one at
            // once: a compaction, or a cancel, in between would end it with fewer events on
            // one side. Both wait until every watch is caught up.
            let revision = sim.inspect(|s| s.store.revision());
            for side in sides.iter_mut() {
                side.streams.barrier(revision).await;
            }
        }
        let on_a_stream = matches!(step, Step::Watch { .. } | Step::Cancel { .. });
        for side in sides.iter_mut() {
            if on_a_stream {
                side.streams.send(&step).await;
            } else {
                side.answers.push(apply::send(&mut side.client, &step).await);
            }
        }
        if on_a_stream {
            // etcd stamps a created or cancelled answer with its revision when it sends it, so
            // a write sent meanwhile on another connection can land first: the next step waits
            // for the answer (a progress answer comes after it on the stream).
            let revision = sim.inspect(|s| s.store.revision());
            for side in sides.iter_mut() {
                side.streams.barrier(revision).await;
            }
        }
        if let [a, b] = sides
            && let (Some(x), Some(y)) = (a.answers.last(), b.answers.last())
            && a.answers.len() == b.answers.len()
            && !apply::same(x, y)
        {
            return Err(format!(
                "seed {seed}, step {i}: {} and {} differ on\n  {step:?}\n{:>9}: {x:?}\n{:>9}: {y:?}\n\
                 (replay: PODLOCK_SIM_SEED={seed} PODLOCK_SIM_SEQUENCES=1 cargo test --test sim)",
                a.name, b.name, a.name, b.name
            ));
        }
        if matches!(step, Step::Expire { .. }) {
            tokio::time::sleep(EXPIRY_WAIT).await;
        }
    }
    let revision = sim.inspect(|s| s.store.revision());
    for side in sides.iter_mut() {
        side.streams.barrier(revision).await;
        side.streams.drain(Duration::from_millis(100)).await;
    }
    Ok(steps)
}

async fn sequence(seed: u64, steps: usize) -> Result<Counts, String> {
    let real = EtcdServer::start().await;
    let sim = Etcd::start(Config::default());
    let mut sides = [
        Side::new("simulated", sim.client().await).await,
        Side::new("etcd", real.client().await).await,
    ];
    let requests = drive(seed, steps, &sim, &mut sides).await?;
    compare_watches(seed, [&sides[0].streams, &sides[1].streams])?;
    Ok(Counts {
        requests,
        events: sides[1].streams.events,
    })
}

/// Compares what each watch of two sides was told.
pub fn compare_watches(seed: u64, streams: [&Streams; 2]) -> Result<(), String> {
    for s in streams {
        if let Some(i) = s.answered_ahead.iter().position(|&n| n > 0) {
            return Err(format!(
                "seed {seed}: {} answered a progress request on stream {i} while a watch of it \
                 started past the current revision (etcd 3.6 does not)",
                s.side()
            ));
        }
    }
    for (i, (sim, real)) in streams[0].logs.iter().zip(&streams[1].logs).enumerate() {
        let ids = sim.keys().chain(real.keys());
        for id in ids {
            let (a, b) = (sim.get(id), real.get(id));
            if a != b {
                return Err(format!(
                    "seed {seed}: watch {id} of stream {i} differs\nsimulated: {}\n     etcd: {}\n\
                     (replay: PODLOCK_SIM_SEED={seed} PODLOCK_SIM_SEQUENCES=1 cargo test --test sim)",
                    first_difference(a, b, true),
                    first_difference(a, b, false),
                ));
            }
        }
    }
    Ok(())
}

/// The first entry where the two logs differ, from `a`'s side (or `b`'s).
fn first_difference(a: Option<&watches::WatchLog>, b: Option<&watches::WatchLog>, a_side: bool) -> String {
    let (Some(a), Some(b)) = (a, b) else {
        return format!("{:?}", if a_side { a } else { b });
    };
    let log = if a_side { a } else { b };
    if a.control != b.control {
        return format!("control answers {:?}", log.control);
    }
    if a.progress != b.progress {
        return format!("{} progress notices", log.progress);
    }
    let n = a.events.iter().zip(&b.events).take_while(|(x, y)| x == y).count();
    format!("event {n} of {}: {:?}", log.events.len(), log.events.get(n))
}
