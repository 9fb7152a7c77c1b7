//! Everything the simulated etcd holds, and the changes that touch both the key space and the
//! leases: a write's lease attachments, a lease's revocation with its keys.

use super::errors::EtcdError;
use super::leases::Leases;
use super::store::{KeyRange, Store, Write};
use etcd_client::proto::{PbKeyValue, PbResponseHeader};
use std::time::Duration;
use tokio::time::Instant;

/// How the simulated etcd is set up; the defaults are a single etcd 3.6 member's.
#[derive(Clone, Debug)]
pub struct Config {
    /// The smallest lease TTL granted, in seconds (etcd: 1.5 election timeouts, rounded up).
    pub min_lease_ttl: i64,
    /// etcd's `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// The id of the first lease granted without an id.
    pub first_lease_id: i64,
    /// etcd's `--experimental-watch-progress-notify-interval`.
    pub progress_notify_interval: Duration,
    /// What a new leader adds to every lease's TTL (etcd: the election timeout).
    pub election_timeout: Duration,
    /// The cluster id in every header.
    pub cluster_id: u64,
    /// The member id in every header.
    pub member_id: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_lease_ttl: 2,
            max_txn_ops: 128,
            first_lease_id: 0x5e11_0000_0000_0001,
            progress_notify_interval: Duration::from_secs(600),
            election_timeout: Duration::from_secs(1),
            cluster_id: 0x51_c1_05_7e,
            member_id: 0x51_3e_3b_e7,
        }
    }
}

/// The simulated etcd's data: keys, leases, the raft term its headers carry.
#[derive(Clone, Debug)]
pub struct State {
    /// The key space.
    pub store: Store,
    /// The leases.
    pub leases: Leases,
    /// The setup.
    pub config: Config,
    raft_term: u64,
}

impl State {
    /// An empty etcd, as a new cluster starts.
    pub fn new(config: Config) -> Self {
        State {
            store: Store::default(),
            leases: Leases::new(config.first_lease_id, config.min_lease_ttl),
            config,
            raft_term: 2,
        }
    }

    /// Fills a top-level answer's header as etcd's server does: ids and term always, the
    /// revision unless the applier set one.
    pub fn fill(&self, header: &mut Option<PbResponseHeader>) {
        let h = header.get_or_insert_with(Default::default);
        h.cluster_id = self.config.cluster_id;
        h.member_id = self.config.member_id;
        h.raft_term = self.raft_term;
        if h.revision == 0 {
            h.revision = self.store.revision();
        }
    }

    /// A header for an answer outside the key space (leases, watches) at the current revision.
    pub fn header(&self) -> Option<PbResponseHeader> {
        let mut h = None;
        self.fill(&mut h);
        h
    }

    /// What watch streams and the lease reaper wait on: revisions, the next lease expiry, the
    /// term; a change that leaves it alone wakes neither.
    pub fn epoch(&self) -> (i64, i64, Option<Instant>, u64) {
        let s = &self.store;
        (
            s.revision(),
            s.compacted(),
            self.leases.next_expiry(),
            self.raft_term,
        )
    }

    /// Commits `write`, moving each changed key between leases as etcd's mvcc write does.
    pub fn commit(&mut self, write: Write) {
        let current = self.store.revision();
        for (key, lease) in write.changes() {
            if let Some(old) = self.store.get_at(key, current) {
                self.leases.detach(old.lease, key);
            }
            if let Some(new) = lease.filter(|&l| l != 0) {
                self.leases.attach(new, key);
            }
        }
        self.store.commit(write);
    }

    /// Revokes lease `id`: its keys are deleted in one revision, in key order (etcd sorts them
    /// so that every member writes the same).
    pub fn revoke(&mut self, id: i64) -> Result<(), EtcdError> {
        let lease = self.leases.revoke(id)?;
        let mut write = self.store.begin();
        for key in &lease.keys {
            write.delete(&self.store, &KeyRange::new(key, &[]));
        }
        self.commit(write);
        Ok(())
    }

    /// Revokes every lease expired at `now`, lowest id first.
    pub fn expire(&mut self, now: Instant) {
        for id in self.leases.expired(now) {
            self.revoke(id).expect("an expired lease exists");
        }
    }

    /// The live keys under `prefix` now, in key order: what a checker looks at.
    pub fn keys_under(&self, prefix: &[u8]) -> Vec<PbKeyValue> {
        let mut kvs = self.store.range_at(&KeyRange::new(prefix, b"\0"), 0);
        kvs.retain(|kv| kv.key.starts_with(prefix));
        kvs
    }

    /// A leader change: a new term, and every lease's TTL starts again from its latest
    /// checkpoint, if it had one.
    pub fn change_leader(&mut self, now: Instant) {
        self.raft_term += 1;
        self.leases.promote(now, self.config.election_timeout);
    }
}
