//! The simulated etcd alone, as the seeded world will run it: on a current-thread runtime with
//! paused time. The same seed twice gives the same transcript (every answer, every watch's
//! log), and its leases expire on Tokio's clock, not the wall's.

use super::{STREAMS, Side, drive};
use podlock_sim::etcd::{Config, Etcd};
use std::time::Instant;

/// Runs `seed` twice on paused time and compares the transcripts; says how long each took in
/// simulated and in wall time.
pub fn check(seed: u64, steps: usize) -> Result<String, String> {
    let wall = Instant::now();
    let (first, simulated) = run(seed, steps)?;
    let (second, _) = run(seed, steps)?;
    if first != second {
        let n = first
            .lines()
            .zip(second.lines())
            .take_while(|(a, b)| a == b)
            .count();
        return Err(format!(
            "seed {seed}: two runs on paused time differ at transcript line {n}:\n{:?}\n{:?}",
            first.lines().nth(n),
            second.lines().nth(n)
        ));
    }
    Ok(format!(
        "sim: seed {seed} on paused time twice, {} transcript lines alike; {:.1} s of simulated time \
         in {:.1} s ({STREAMS} watch streams)",
        first.lines().count(),
        simulated.as_secs_f64(),
        wall.elapsed().as_secs_f64() / 2.0
    ))
}

fn run(seed: u64, steps: usize) -> Result<(String, std::time::Duration), String> {
    let runtime = podlock_sim::paused_runtime();
    runtime.block_on(async {
        let start = tokio::time::Instant::now();
        let sim = Etcd::start(Config::default());
        let mut sides = [Side::new("simulated", sim.client().await).await];
        drive(seed, steps, &sim, &mut sides).await?;
        let [side] = sides;
        let mut transcript: Vec<String> = side.answers.iter().map(|a| format!("{a:?}")).collect();
        transcript.extend(side.streams.logs.iter().map(|l| format!("{l:?}")));
        Ok((transcript.join("\n"), start.elapsed()))
    })
}
