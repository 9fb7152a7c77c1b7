//! The simulated etcd of `tests/sim` (podlock-sim) proven against a real etcd: see
//! `tests/sim/diff/mod.rs` and docs/design.md, "The simulated etcd".

#[path = "../common/mod.rs"]
mod common;
mod diff;

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    match runtime.expect("a Tokio runtime").block_on(diff::run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
