//! Admission: the mutating webhook that injects the sidecar ([`webhook`]), its configuration in
//! the API server ([`configuration`]) and flags ([`args`]), and its serving certificate, kept
//! current ([`certs`]). The injection itself is pure functions in
//! [`inject`](super::inject).

pub(super) mod args;
pub(super) mod certs;
pub(super) mod configuration;
#[cfg(test)]
mod tests;
pub(super) mod webhook;
