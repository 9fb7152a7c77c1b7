//! podlock: fair, fenced, liveness-aware locks for Kubernetes pods, on etcd.
//!
//! Dependencies point toward the engine: [`lock`] knows nothing of HTTP or Kubernetes;
//! [`sidecar`] serves it over HTTP; [`cli`] talks to etcd or to a sidecar.

pub mod cli;
pub mod etcd_args;
pub mod lock;
pub mod metrics;
pub mod sidecar;
