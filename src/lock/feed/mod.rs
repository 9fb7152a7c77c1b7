//! Watches that outlive a wait: a lock's settings and this process's own entries in its queue,
//! watched once and shared by every wait and hold of the process on that lock. The
//! [`Engine`](crate::lock::engine::Engine) owns its process's feeds.
//!
//! A wait used to watch its own key and the lock's settings, and a hold its key: watches made
//! and cancelled on every grant, each a message to etcd and a watcher registered and torn down
//! there (issue #43). A *feed* watches the same keys for as long as the process uses the lock:
//! the settings key, and every key under the session's lease in the lock's queue
//! (`{queue}/{lease:016x}/`), which holds this process's entries and nobody else's. It keeps
//! its recent changes, so a wait that read its position at revision `r` follows every change
//! after `r` without a watch of its own ([`Subscription::from`] says from where it can).
//!
//! The feeds of a process share one watch stream (`stream.rs`); each feed keeps its recent
//! changes (`kept.rs`); a feed nobody used for `LINGER` (`follow.rs`) is cancelled.

mod follow;
mod kept;
mod stream;

pub(in crate::lock) use follow::{Feeds, Subscription};
