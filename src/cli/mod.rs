//! Client commands: `podlock declare` (settings in etcd), `podlock lock` (run a command
//! while holding a lock through the sidecar), `podlock fence` (is a token still a current
//! hold), `podlock observe` (who holds a lock, at each change), `podlock probe` (the sidecar's
//! probe) and `podlock pre-uninstall` (the chart's `pre-delete` hook).

pub mod declare;
pub mod fence;
pub mod observe;
pub mod pre_uninstall;
pub mod probe;
pub mod run_locked;
