//! podlock's deterministic simulation: [`etcd`], a simulated etcd that podlock's own engine
//! reaches through etcd-client's `raw-channel`, proven against a real etcd by podlock's `sim`
//! test (docs/design.md, "The simulated etcd"), and [`rng`], the seeded randomness of a run.

pub mod etcd;
pub mod rng;

/// A current-thread Tokio runtime on paused time, the simulation's: its clock moves only when
/// every task waits, so a run takes no wall-clock time beyond its work and repeats itself.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a Tokio runtime")
}
