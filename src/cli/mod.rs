//! Client commands: `podlock declare` (settings in etcd), `podlock lock` (run a command
//! while holding a lock through the sidecar), `podlock fence` (is a token still a current
//! hold) and `podlock probe` (the sidecar's probe).

pub mod declare;
pub mod fence;
pub mod probe;
pub mod run_locked;
