//! podlock: fair, fenced, liveness-aware locks for Kubernetes pods, on etcd.
//!
//! Dependencies point toward the engine: [`lock`] knows nothing of HTTP or Kubernetes;
//! [`sidecar`] serves it over HTTP; [`operator`] reconciles [`crd::DistributedLock`] objects
//! with etcd; [`cli`] talks to etcd or to a sidecar. [`retry`], the one retry policy, is a leaf
//! that the engine and the operator both use; [`critical_path`], marks a benchmark reads, is
//! another. [`etcd_version`] is what the sidecar and the operator both do with etcd's version.

pub mod cli;
pub mod crd;
pub mod critical_path;
pub mod etcd_args;
pub mod etcd_transport;
pub mod etcd_version;
pub mod lock;
pub mod metrics;
pub mod operator;
pub mod retry;
pub mod sidecar;
