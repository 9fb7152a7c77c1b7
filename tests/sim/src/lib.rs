//! podlock's deterministic simulation: [`etcd`], a simulated etcd that podlock's own engine
//! reaches through etcd-client's `raw-channel`, proven against a real etcd by podlock's `sim`
//! test (docs/design.md, "The simulated etcd"); [`rng`], the seeded randomness of a run; and
//! [`world`], podlock's engine run against the simulated etcd, seed after seed ("The seeded
//! world"). A library, not part of the test, so that it is built optimized (Cargo.toml).

pub mod etcd;
pub mod rng;
pub mod world;

/// The number in the environment variable `name`, or `default`.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}: {v:?}")))
}

/// A current-thread Tokio runtime on paused time, the simulation's: its clock moves only when
/// every task waits, so a run takes no wall-clock time beyond its work and repeats itself.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a Tokio runtime")
}
