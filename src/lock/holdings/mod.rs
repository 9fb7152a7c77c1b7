//! What an [`Engine`](super::Engine) keeps of this sidecar's holds: each granted hold
//! ([`hold`]), the registry of holds and waits, one slot per (lock, holder id), and the
//! subscribers to their events.

pub(super) mod events;
pub(super) mod hold;
pub(super) mod max_hold;
pub(super) mod registry;
