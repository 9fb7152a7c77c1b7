//! podlock's deterministic simulation: [`etcd`], a simulated etcd that podlock's own engine
//! reaches through etcd-client's `raw-channel`, proven against a real etcd by podlock's `sim`
//! test (docs/design.md, "The simulated etcd"), and [`rng`], the seeded randomness of a run.

pub mod etcd;
pub mod rng;
