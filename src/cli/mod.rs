//! Client commands: `podlock declare` (settings in etcd), `podlock lock` (run a command
//! while holding a lock through the sidecar) and `podlock probe` (the sidecar's probe).

pub mod declare;
pub mod probe;
pub mod run_locked;
