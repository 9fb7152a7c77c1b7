//! The simulated etcd of `tests/sim` (podlock-sim) replayed on paused time and proven against a
//! real etcd: see `tests/sim/diff/mod.rs` and docs/design.md, "The simulated etcd".

#[path = "../common/mod.rs"]
mod common;
mod diff;

fn main() -> std::process::ExitCode {
    match diff::run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
