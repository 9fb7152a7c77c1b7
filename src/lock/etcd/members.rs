//! Which etcd member a new watch or request goes to.
//!
//! The balanced etcd client spreads new requests and streams over the members at random (tonic's
//! p2c balancer, every connection's load 0), blind to a member that stalled (SIGSTOP, a frozen
//! VM: its connections stay open, nothing is answered). A watch found silent on it, or a request
//! it left unanswered, is sent anew, and through the balanced client lands on the same member
//! again half the time, costing a watch-open bound or a hedge each time (issue #12, finding 5).
//! [`Members`] keeps one client per member and a "suspect until" mark on each, and hands out the
//! members not suspect in turn, so that after one silence the next watch or read goes to a
//! member that answers.

use etcd_client::Client;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// How long a member found silent is passed over. Long enough that a member that stays stalled
/// costs one hedge or one watch-open bound per period, short enough that one that was only slow
/// (a GC pause, a busy disk) soon gets its share again.
const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// One client per etcd member, and which of them were found silent lately.
pub struct Members {
    clients: Vec<Client>,
    /// Per member: passed over until then.
    suspect_until: Mutex<Vec<Option<Instant>>>,
    /// Where the next turn starts.
    turn: AtomicUsize,
}

/// A member's client, and its index for [`Members::suspect`] (`None`: the balanced client).
pub type Route = (Option<usize>, Client);

impl Members {
    /// The members reached by `clients`, one each (none: a single endpoint, where there is no
    /// other member to turn to).
    pub fn new(clients: Vec<Client>) -> Self {
        Members {
            suspect_until: Mutex::new(vec![None; clients.len()]),
            clients,
            turn: AtomicUsize::new(0),
        }
    }

    /// The client for a new watch or request: the next member in turn that is not suspect; if
    /// all are, the one whose mark ends first. `balanced` when there is one endpoint only.
    pub fn pick(&self, balanced: &Client) -> Route {
        if self.clients.is_empty() {
            return (None, balanced.clone());
        }
        let i = self.pick_index(Instant::now());
        (Some(i), self.clients[i].clone())
    }

    /// The index of the next member in turn among those not suspect at `now`.
    fn pick_index(&self, now: Instant) -> usize {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let marks = self.suspect_until.lock().unwrap();
        let healthy: Vec<usize> = (0..marks.len())
            .filter(|&i| marks[i].is_none_or(|until| until <= now))
            .collect();
        match healthy.len() {
            0 => (0..marks.len()).min_by_key(|&i| marks[i]).expect("no members"),
            n => healthy[turn % n],
        }
    }

    /// One client per member (none: a single endpoint), in the order of the endpoints.
    pub fn each(&self) -> &[Client] {
        &self.clients
    }

    /// Marks member `i` (from [`pick`](Self::pick)) as silent: it is passed over for
    /// [`SUSPECT_FOR`]. Nothing for the balanced client.
    pub fn suspect(&self, i: Option<usize>, why: &str) {
        let Some(i) = i else { return };
        let mut marks = self.suspect_until.lock().unwrap();
        let now = Instant::now();
        if marks[i].is_none_or(|until| until <= now) {
            warn!(
                member = i,
                why, "etcd member suspect; new watches and requests go elsewhere"
            );
        }
        marks[i] = Some(now + SUSPECT_FOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members without clients, for the choice alone.
    fn members(n: usize) -> Members {
        Members {
            clients: vec![],
            suspect_until: Mutex::new(vec![None; n]),
            turn: AtomicUsize::new(0),
        }
    }

    fn picks(m: &Members, n: usize) -> Vec<usize> {
        (0..n).map(|_| m.pick_index(Instant::now())).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn members_take_turns_and_a_suspect_one_is_passed_over_for_a_while() {
        let m = members(3);
        assert_eq!(picks(&m, 4), vec![0, 1, 2, 0]);
        m.suspect(Some(1), "test");
        assert_eq!(picks(&m, 4), vec![0, 2, 0, 2]);
        tokio::time::advance(SUSPECT_FOR).await;
        assert_eq!(picks(&m, 3), vec![2, 0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_member_is_suspect_the_one_marked_first_is_tried() {
        let m = members(3);
        m.suspect(Some(2), "test");
        tokio::time::advance(Duration::from_millis(1)).await;
        m.suspect(Some(0), "test");
        m.suspect(Some(1), "test");
        assert_eq!(picks(&m, 2), vec![2, 2]);
    }
}
