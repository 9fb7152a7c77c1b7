//! The simulated etcd of `tests/sim` (podlock-sim) replayed on paused time and proven against a
//! real etcd (`tests/sim/diff/mod.rs`), and podlock's engine run against it in a seeded world
//! (`tests/sim/src/world/mod.rs`), and in scripted scenes of the findings it reproduces step by
//! step (`tests/sim/src/world/scenes.rs`); docs/design.md, "The simulated etcd", "The seeded world"
//! and "Scenes"; and known bugs turned back on in the engine, each until a seed finds it
//! (`tests/sim/src/world/bugs.rs`). `PODLOCK_SIM_PART=diff`, `world`, `scenes` or `bugs` runs
//! one part alone.

#[path = "../common/mod.rs"]
mod common;
mod diff;

use podlock_sim::{env, world};

fn main() -> std::process::ExitCode {
    let chosen = std::env::var("PODLOCK_SIM_PART").unwrap_or_default();
    let part = |name: &str, run: fn() -> Result<(), String>| match chosen.is_empty() || chosen == name {
        true => run(),
        false => Ok(()),
    };
    let parts = part("diff", diff::run)
        .and_then(|()| part("world", world::run))
        .and_then(|()| part("scenes", world::scenes::run))
        .and_then(|()| part("bugs", world::bugs::run));
    match parts {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
