//! Admission: the mutating webhook that injects the sidecar ([`webhook`]) and its serving
//! certificate, kept current ([`certs`]). The injection itself is pure functions in
//! [`inject`](super::inject).

pub(super) mod certs;
pub(super) mod webhook;
