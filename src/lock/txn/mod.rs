//! podlock's transactions on etcd: the queue (enqueue, guarded removal), the later writes of
//! an entry (grant records, yield requests), a multi-lock set's, direct handoff, release
//! receipts, a lock's settings, and the note an administrator's force release leaves. Each is one etcd transaction, built from the pure
//! records and rules of [`protocol`](super::protocol) and sent through [`etcd`](super::etcd).

pub(super) mod entry_swap;
pub(super) mod handoff;
pub(super) mod multi_lock;
pub(super) mod queue;
pub(super) mod receipt;
pub(super) mod release_note;
pub(super) mod settings;
