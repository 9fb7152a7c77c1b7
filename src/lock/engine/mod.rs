//! The engine's state: [`Engine`] itself (`state.rs`: its etcd client, sessions, settings cache
//! and read-only views, and the orphan sweep beside it), and what it keeps of this sidecar's
//! holds: each granted hold ([`hold`]), the registry of holds and waits, one slot per (lock,
//! holder id), and the subscribers to their events. The engine's verbs live in the wings above.

pub(super) mod events;
mod footprint;
pub(super) mod hold;
pub(super) mod max_hold;
pub(super) mod receipts;
pub(super) mod registry;
mod settings_cache;
mod state;

pub use footprint::Footprint;
pub use state::Engine;
