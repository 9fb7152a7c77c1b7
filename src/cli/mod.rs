//! Client commands: `podlock declare` (settings in etcd) and `podlock lock` (run a command
//! while holding a lock through the sidecar).

pub mod declare;
pub mod run_locked;
