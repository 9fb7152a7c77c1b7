//! A stalled etcd member (SIGSTOP: its connections stay open, nothing is answered) under the
//! watch a waiter or a holder relies on must not hold back the handoff or the `lost` notice
//! past the contract's 1 s (issue #12, finding 5): a silent watch is asked for progress and,
//! unanswered, moved to another member.
//!
//! Each sidecar under test reaches the two followers only, so that the new watch on one of
//! them is its own, and the leader (quorum with the other follower) serves on.
//!
//! The re-read or re-watch after a stall is found must not land on the stalled member again (the
//! balanced etcd client would send it there half the time): the engine marks the member suspect
//! and opens new watches and requests on another one (`src/lock/etcd/members.rs`).

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::{sleep, timeout};

use crate::common::events::Events;
use crate::common::members::{elected, watched_member};
use crate::common::{EtcdServer, Sidecar, declare};

/// The contract's 1 s for a handoff or a `lost` notice, plus headroom for a loaded machine.
const LIMIT: Duration = Duration::from_millis(1500);

/// A 3-member cluster with one lock declared.
struct Cluster {
    etcd: Vec<EtcdServer>,
    leader: usize,
    followers: Vec<usize>,
}

impl Cluster {
    /// Starts the cluster, finds its leader and declares `lock`.
    async fn start(lock: &str) -> Self {
        let etcd = EtcdServer::cluster(3).await;
        let leader = elected(&etcd).await;
        declare(&etcd[leader].endpoint, &[lock]);
        let followers = (0..etcd.len()).filter(|&i| i != leader).collect();
        Cluster {
            etcd,
            leader,
            followers,
        }
    }

    /// The followers' client URLs, for a sidecar whose watches must land on a follower.
    fn followers_endpoints(&self) -> String {
        let urls: Vec<&str> = (self.followers.iter())
            .map(|&i| self.etcd[i].endpoint.as_str())
            .collect();
        urls.join(",")
    }

    /// How many watchers each follower serves now.
    async fn follower_watchers(&self) -> Vec<u64> {
        let mut counts = vec![];
        for &i in &self.followers {
            counts.push(self.etcd[i].watchers().await);
        }
        counts
    }

    /// Once a follower serves a watch beyond `before`, and has for 1 s (the watch has settled,
    /// its silence checks running), stops that member; returns its index.
    async fn stall_new_watch(&self, before: &[u64]) -> usize {
        let members: Vec<_> = self.followers.iter().map(|&i| &*self.etcd[i]).collect();
        let stalled = self.followers[watched_member(&members, before).await];
        sleep(Duration::from_secs(1)).await;
        self.etcd[stalled].signal(libc::SIGSTOP);
        stalled
    }
}

#[tokio::test]
async fn a_waiter_whose_watch_is_on_a_stalled_member_is_granted_within_the_contract() {
    let c = Cluster::start("handoff").await;
    let holder = Sidecar::start(&c.etcd[c.leader].endpoint, "holder", &[]).await;
    let waiter = Arc::new(Sidecar::start(&c.followers_endpoints(), "waiter", &[]).await);
    holder.must_acquire("handoff", json!({})).await;
    let before = c.follower_watchers().await;
    let w = waiter.clone();
    let granted = tokio::spawn(async move {
        let answer = w.post("handoff", "acquire", json!({"waitSeconds": 30})).await;
        (answer, Instant::now())
    });
    let stalled = c.stall_new_watch(&before).await;
    let (status, body) = holder.post("handoff", "release", json!({})).await;
    let released = Instant::now();
    assert_eq!(status, 200, "release: {body}");
    let answer = timeout(Duration::from_secs(20), granted).await;
    c.etcd[stalled].signal(libc::SIGCONT);
    let ((status, grant), at) = answer.expect("the waiter was never answered").unwrap();
    assert_eq!(status, 200, "the waiter's acquire: {grant}");
    let took = at - released;
    eprintln!("stalled member under a waiter's watch: granted {took:?} after the release");
    assert!(
        took <= LIMIT,
        "the waiter whose watch was on the stalled member was granted {took:?} after the \
         release (limit {LIMIT:?}); its log:\n{}",
        waiter.log()
    );
}

#[tokio::test]
async fn a_holder_whose_watch_is_on_a_stalled_member_is_told_lost_within_the_contract() {
    let c = Cluster::start("lost").await;
    let s = Sidecar::start(&c.followers_endpoints(), "holder", &[]).await;
    let mut events = Events::open(&s, "lost").await;
    let before = c.follower_watchers().await;
    let token = s.must_acquire("lost", json!({})).await;
    assert_eq!(events.next(Duration::from_secs(1)).await["type"], "acquired");
    // The hold's key is watched from 100 ms into the hold on.
    let stalled = c.stall_new_watch(&before).await;
    c.etcd[c.leader].delete_queue("lost").await;
    let deleted = Instant::now();
    let event = timeout(Duration::from_secs(20), events.next(Duration::from_secs(20))).await;
    let took = deleted.elapsed();
    c.etcd[stalled].signal(libc::SIGCONT);
    let event = event.expect("no lost event");
    eprintln!("stalled member under a hold's watch: lost {took:?} after the key was deleted");
    assert_eq!(
        (event["type"].as_str(), event["fencingToken"].as_i64()),
        (Some("lost"), Some(token)),
        "{event}"
    );
    assert!(
        took <= LIMIT,
        "the holder whose watch was on the stalled member was told lost {took:?} after its key \
         was deleted (limit {LIMIT:?}); its log:\n{}",
        s.log()
    );
}
