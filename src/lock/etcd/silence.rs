//! Telling a stalled member from a silent rule of etcd's. A watch stream that says nothing for
//! [`WATCH_SILENCE`] is asked for its progress, and a member that does not answer is taken for
//! stalled. But etcd 3.6 answers no progress request on a stream while one of its watches starts
//! past the member's revision (`progressIfSync`), and a waiter watches from the revision after
//! its read: on an etcd where nothing is written, that silence is the rule. [`Silence`] keeps
//! the latest start asked for and the latest revision heard; when the first is ahead, a member
//! that answers a read below it is not stalled (finding F15 of #55: every quiet waiter remade its
//! watches about once a second and accused a healthy member).

use etcd_client::{Client, GetOptions};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::timeout;

use super::Stats;

/// How long a watch may be silent before etcd is asked whether it still serves it, and how long
/// that answer may take (see `KeyWatch::next` and the feeds' stream). A stalled member is thus left within about
/// twice this, inside the 1 s the contract allows for a `lost` notice and a handoff. It costs one
/// small message on the watch's stream per silent interval.
pub(in crate::lock) const WATCH_SILENCE: Duration = Duration::from_millis(400);

/// One watch stream's starts and what it heard, and the member serving it.
pub(in crate::lock) struct Silence {
    client: Client,
    /// A key the probe reads (one the stream watches; its count is all the probe asks for).
    key: Vec<u8>,
    /// The largest start revision of a watch made on the stream.
    ahead: i64,
    /// The largest revision the stream was told of.
    heard: i64,
}

impl Silence {
    /// The stream served by `client`, watching `key` among others.
    pub fn new(client: Client, key: Vec<u8>) -> Self {
        Silence {
            client,
            key,
            ahead: 0,
            heard: 0,
        }
    }

    /// A watch from `start` on (`None`: from now) was made on the stream.
    pub fn asked(&mut self, start: Option<i64>) {
        self.ahead = self.ahead.max(start.unwrap_or(0));
    }

    /// The stream was told of revision `rev` (any message's header).
    pub fn heard(&mut self, rev: i64) {
        self.heard = self.heard.max(rev);
    }

    /// Whether an unanswered progress request is etcd's rule rather than a stalled member: a
    /// watch starts past what the stream heard, and the member answers a local read within
    /// [`WATCH_SILENCE`]. Its revision is heard: once it reached the start, the rule no longer
    /// explains a silence, and the next unanswered request finds the member stalled.
    pub async fn explained(&mut self, stats: &Stats) -> bool {
        if self.ahead <= self.heard {
            return false;
        }
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let read = GetOptions::new().with_serializable().with_count_only();
        let answer = timeout(WATCH_SILENCE, self.client.get(self.key.clone(), Some(read))).await;
        let Ok(Ok(answer)) = answer else {
            return false;
        };
        self.heard(answer.header().map_or(0, |h| h.revision()));
        true
    }
}
