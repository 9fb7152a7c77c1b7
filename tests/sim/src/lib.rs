//! podlock's deterministic simulation. For now: [`etcd`], a simulated etcd that podlock's own
//! engine reaches through etcd-client's `raw-channel`, proven against a real etcd by podlock's
//! `sim` test (docs/design.md, "The simulated etcd").

pub mod etcd;
