//! The simulated etcd of `tests/sim` (podlock-sim) replayed on paused time and proven against a
//! real etcd (`tests/sim/diff/mod.rs`), and podlock's engine run against it in a seeded world
//! (`tests/sim/src/world/mod.rs`); docs/design.md, "The simulated etcd" and "The seeded world".
//! `PODLOCK_SIM_PART=diff` or `world` runs one part alone.

#[path = "../common/mod.rs"]
mod common;
mod diff;

use podlock_sim::{env, world};

fn main() -> std::process::ExitCode {
    let part = std::env::var("PODLOCK_SIM_PART").unwrap_or_default();
    let diff = || {
        if part.is_empty() || part == "diff" {
            diff::run()
        } else {
            Ok(())
        }
    };
    let world = || {
        if part.is_empty() || part == "world" {
            world::run()
        } else {
            Ok(())
        }
    };
    match diff().and_then(|()| world()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
