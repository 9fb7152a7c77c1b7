//! What an engine keeps now, counted ([`Engine::footprint`]): for `/metrics` and status, and
//! for tests that look for what outlived the holds and waits that made it (issue #54, item 4).

use serde::Serialize;
use std::sync::atomic::Ordering;

use super::state::Engine;

/// What one sidecar's engine keeps at a moment, counted. Each lives only as long as something
/// uses it (bounded by time or by a capacity): a count that stays up once every hold and wait
/// ended is a leak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Footprint {
    /// Holds, and acquires in progress (the registry's slots but its memory of lost holds).
    pub holds_and_waits: usize,
    /// Release receipts' slots taken: releases in flight, and for a while those never answered.
    pub receipt_slots: usize,
    /// Feeds kept, followed or lingering (each two etcd watches on the shared stream).
    pub feeds: usize,
    /// Of them, those a wait or hold follows now.
    pub followed_feeds: usize,
    /// Watch streams of its own open now (a wait's, an observer's).
    pub watch_streams: u64,
    /// Sessions (leases kept alive), lost ones included until replaced.
    pub sessions: usize,
    /// Locks whose settings it keeps.
    pub cached_settings: usize,
}

impl Engine {
    /// What this engine keeps now, counted (see [`Footprint`]).
    pub async fn footprint(&self) -> Footprint {
        let (feeds, followed_feeds) = self.feeds().count();
        Footprint {
            holds_and_waits: self.local().len(),
            receipt_slots: self.receipt_slots().taken(),
            feeds,
            followed_feeds,
            watch_streams: self.stats().open_streams.load(Ordering::Relaxed),
            sessions: self.sessions().leases().await.len(),
            cached_settings: self.cached_settings(),
        }
    }
}
