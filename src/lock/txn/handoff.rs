//! Direct handoff: a release grants the next waiter in the same transaction.
//!
//! A holder in exclusive mode knows the keys right behind it (its [`Chain`]): the read that
//! granted it returns them, or the release ahead handed them on with its grant. Its release is
//! then one transaction that deletes its key and writes the grant into the first of them
//! ([`Entry::handed`]), passing on the rest of the chain, guarded by its own key (create
//! revision), the settings its grant was decided under, and the successor's key being
//! untouched since its enqueue (mod revision = create revision: not given up and enqueued
//! again, not granted). The successor learns its grant from that write, one watch event on its
//! own key, with no read ([`granted`]).
//!
//! In a semaphore the holder hands on its own slot. That is sound because no key is ever
//! put ahead of another: the keys ahead of the successor are then some of those that were
//! ahead of the holder when it was granted, which were all recorded and fewer than
//! `maxHolders`, and the settings are those they were. The successor is handed the grant a
//! read would give it; it records it (`acquiredAt`) before it answers, as a semaphore's holder
//! granted by a read does, for the keys behind it. When the key behind is itself already
//! granted (by a read, after a holder ahead left), the write hands it nothing new and the key
//! after it is let in by a read, as before.
//!
//! A weighted hold hands its slots on only to a successor that asks for no more permits than
//! it holds: the keys ahead of the successor are some of those that were ahead of the holder,
//! whose permits left room for the holder's, so they leave room for the successor's too. A
//! larger successor is let in by a read, once the permits it asks for are free (the model's
//! "permits ignored by a handoff" shows the limit broken otherwise).
//!
//! Where a guard fails (the successor gave up, was granted and recorded, the settings
//! changed), the release is the plain guarded delete, and the waiter behind wakes on the
//! deletion and reads its position: the path of a holder whose lease ends, or of a release
//! whose chain ran out. A shared key is never handed a grant: readers granted together would
//! learn their grants in any order, and fencing tokens would fall (the protocol model's run
//! "handoff to a run of readers"). A handed grant does not count as recorded for the keys
//! behind it (`acquiredAt` is not written): otherwise one of them could be let in, with a
//! higher token, before the successor learns of its own grant (the model's "a handed grant
//! counts as recorded").

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use std::time::Duration;
use tokio::sync::watch;
use tokio::time::timeout;
use tracing::debug;

use super::queue::Ticket;
use super::receipt;
use super::settings::Declared;
use crate::critical_path::{self, Point};
use crate::lock::bugs::{self, Bug};
use crate::lock::error::LockError;
use crate::lock::etcd::{self, Etcd};
use crate::lock::protocol::Ask;
use crate::lock::protocol::entry::{Entry, Mode, Successor};
use crate::lock::protocol::handoff::{self as rule, Guard, Party};
use crate::lock::protocol::names::LockId;

/// How many keys behind it a holder reads with the read that grants it. A busy lock then
/// reads once every `CHAIN + 1` grants; the chain rides in the successor's entry, about 300
/// bytes a key.
pub const CHAIN: u32 = 8;

impl Successor {
    /// A key read behind a holder, if a grant may be handed to it ([`rule::may_be_handed`]).
    fn of(kv: &KeyValue) -> Option<Self> {
        let entry = Entry::decode(kv.value()).filter(|e| rule::may_be_handed(party(e)))?;
        Some(Successor {
            key: kv.key_str().ok()?.to_string(),
            revision: kv.create_revision(),
            entry: Entry {
                handed: false,
                next: vec![],
                ..entry
            },
        })
    }
}

/// A key with `entry` as the handoff rule sees it.
fn party(entry: &Entry) -> Party {
    Party {
        ask: Ask {
            mode: entry.mode,
            permits: entry.permits,
        },
        set: !entry.with.is_empty(),
    }
}

/// What a holder may hand its lock on with: the settings its grant was decided under and the
/// keys behind it, nearest first.
#[derive(Debug, Clone)]
pub struct Chain {
    /// The settings, which the release's transaction checks are still in force.
    pub declared: Declared,
    /// The keys behind it.
    pub next: Vec<Successor>,
}

impl Chain {
    /// The chain of a hold granted under `declared` asking `ask` with `next` behind it, if it
    /// may hand on: an exclusive hold with a key behind it that asks for no more permits.
    pub fn of(declared: &Declared, ask: Ask, next: Vec<Successor>) -> Option<Self> {
        let holder = Party { ask, set: false };
        let hands = next
            .first()
            .is_some_and(|s| rule::may_hand(holder, party(&s.entry)));
        hands.then(|| Chain {
            declared: declared.clone(),
            next,
        })
    }
}

/// Whether a waiter in `mode` may be handed its grant (and so watches its own key for
/// writes, and reads the keys behind it with its position): an exclusive one.
pub fn possible(mode: Mode) -> bool {
    rule::may_be_handed(Party {
        ask: Ask::one(mode),
        set: false,
    })
}

/// The read of the keys right behind `ticket`, for its chain.
pub fn behind(lock: &LockId, ticket: &Ticket) -> TxnOp {
    let after = GetOptions::new()
        .with_prefix()
        .with_min_create_revision(ticket.revision + 1)
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(i64::from(CHAIN));
    TxnOp::get(lock.queue_prefix(), Some(after))
}

/// The chain read behind a key: its leading run of exclusive entries.
pub fn chain_of(kvs: &[KeyValue]) -> Vec<Successor> {
    kvs.iter().map_while(Successor::of).collect()
}

/// What a hold's release may hand the lock on with: known when it was granted, or being read
/// while it holds. A hold handed its grant with no key behind it (the chain of a busy lock ran
/// out) reads the keys behind it right away ([`NextKeys::read`]): its release then hands the
/// lock on like any other, rather than leave the next waiter to wake on the deletion and read
/// (the protocol model's `Refill`). The read costs what the waiter's would have.
#[derive(Debug, Clone)]
pub struct NextKeys(watch::Receiver<Option<Option<Chain>>>);

/// How long a release waits for the keys behind its hold to be read; past it, the release
/// is the plain delete and the next waiter reads.
const READ_WAIT: Duration = Duration::from_millis(100);

impl NextKeys {
    /// What a hold granted with `chain` (if it may hand on) hands on with.
    pub fn known(chain: Option<Chain>) -> Self {
        NextKeys(watch::channel(Some(chain)).1)
    }

    /// Reads, in the background, the keys behind `ticket` granted under `declared` asking `ask`.
    pub fn read(etcd: &Etcd, lock: &LockId, ticket: &Ticket, declared: &Declared, ask: Ask) -> Self {
        let (tx, rx) = watch::channel(None);
        let (etcd, read) = (etcd.clone(), Txn::new().and_then([behind(lock, ticket)]));
        let declared = declared.clone();
        tokio::spawn(async move {
            let next = match etcd.txn(read).await {
                Ok(resp) => etcd::gets(resp.op_responses()).next().map(|b| chain_of(b.kvs())),
                Err(e) => {
                    debug!(error = %e, "could not read the keys behind a hold; its release will not hand on");
                    None
                }
            };
            tx.send_replace(Some(next.and_then(|next| Chain::of(&declared, ask, next))));
        });
        NextKeys(rx)
    }

    /// The chain, once known (waiting up to [`READ_WAIT`] for a read under way).
    pub async fn get(&self) -> Option<Chain> {
        let mut known = self.0.clone();
        let read = timeout(READ_WAIT, known.wait_for(Option::is_some)).await;
        read.ok()?.ok()?.clone().flatten()
    }
}

/// Releases `ticket`'s key: hands the lock to the first key of `chain` if it may (see the
/// module's doc), else the plain guarded delete. Returns whether the key was deleted by
/// this release (false: it was already gone).
pub async fn release(
    etcd: &Etcd,
    lock: &LockId,
    (ticket, slot): (&Ticket, u32),
    chain: Option<&Chain>,
) -> Result<bool, LockError> {
    let Some(chain) = chain else {
        return receipt::remove(etcd, ticket, slot).await;
    };
    critical_path::mark(Point::ReleaseSent, ticket.revision, 0);
    let resp = etcd.txn(hand_on(lock, (ticket, slot), chain)).await?;
    if resp.succeeded() {
        let revision = resp.header().map_or(0, |h| h.revision());
        critical_path::mark(Point::ReleaseHanded, ticket.revision, revision);
        return Ok(true);
    }
    match resp.op_responses().into_iter().next() {
        Some(TxnOpResponse::Txn(plain)) => Ok(receipt::released(&plain, ticket)),
        _ => unreachable!("the plain release"),
    }
}

/// The handoff transaction: if the guards hold, delete the key and write the grant into the
/// first successor's entry (keeping its lease); else the plain release (delete the key if it
/// is still ours). Both leave the release receipt, at `slot` (see [`receipt`]).
fn hand_on(lock: &LockId, (ticket, slot): (&Ticket, u32), chain: &Chain) -> Txn {
    let (first, rest) = chain.next.split_first().expect("a chain has a key");
    let grant = Entry {
        handed: true,
        next: rest.to_vec(),
        ..first.entry.clone()
    };
    let guards: Vec<Compare> = (rule::GUARDS.iter())
        .flat_map(|guard| match guard {
            Guard::HolderInPlace => vec![Compare::create_revision(
                ticket.key.as_str(),
                CompareOp::Equal,
                ticket.revision,
            )],
            Guard::SettingsUnchanged if bugs::on(Bug::HandoffUnguarded) => vec![],
            Guard::SettingsUnchanged => chain.declared.unchanged(&lock.config_key()),
            Guard::SuccessorUntouched => vec![Compare::mod_revision(
                first.key.as_str(),
                CompareOp::Equal,
                first.revision,
            )],
        })
        .collect();
    let put = TxnOp::put(
        first.key.as_str(),
        grant.encode(),
        Some(PutOptions::new().with_ignore_lease()),
    );
    Txn::new()
        .when(guards)
        .and_then(receipt::ops(ticket, slot, vec![put]))
        .or_else([TxnOp::txn(receipt::release(ticket, slot))])
}

/// A grant handed to `ticket`, if `events` hold one: a write of its own key that records a
/// handoff. Returns the revision it holds from and the chain handed on with it.
pub fn granted(events: &[etcd_client::Event], ticket: &Ticket) -> Option<(i64, Vec<Successor>)> {
    let kv = (events.iter())
        .filter(|e| e.event_type() == EventType::Put)
        .filter_map(|e| e.kv())
        .find(|kv| kv.key() == ticket.key.as_bytes() && kv.create_revision() == ticket.revision)?;
    let entry = Entry::decode(kv.value()).filter(|e| e.handed)?;
    Some((kv.mod_revision(), entry.next))
}

/// Whether `events` are all grants handed to keys other than `ticket`'s. A handed grant is not
/// a grant record: it lets no key behind the successor in, so a waiter watching that key need
/// not read on it (the protocol model's waiters are not woken by it either).
pub fn handed_to_others(events: &[etcd_client::Event], ticket: &Ticket) -> bool {
    let handed = |kv: &KeyValue| {
        kv.key() != ticket.key.as_bytes() && Entry::decode(kv.value()).is_some_and(|e| e.handed)
    };
    !events.is_empty()
        && (events.iter()).all(|e| e.event_type() == EventType::Put && e.kv().is_some_and(handed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::txn::settings::Settings;

    fn entry(mode: Mode) -> Entry {
        Entry {
            holder_id: "h".into(),
            pod: Default::default(),
            requested_at: "2026-11-26T00:00:00.000Z".into(),
            acquired_at: None,
            ttl_seconds: 15,
            heartbeat_timeout_seconds: 0,
            max_hold_seconds: 0,
            container: None,
            mode,
            permits: 1,
            epoch: 0,
            handed: false,
            next: vec![],
            with: vec![],
            yield_deadline: None,
        }
    }

    fn declared(max_holders: u32) -> Declared {
        let settings = Settings {
            max_holders,
            ..Settings::default()
        };
        Declared {
            settings,
            revision: 3,
            value: b"{}".to_vec().into(),
        }
    }

    #[test]
    fn only_an_exclusive_holder_with_a_key_behind_it_hands_on() {
        let behind = || {
            vec![Successor {
                key: "k".into(),
                revision: 9,
                entry: entry(Mode::Exclusive),
            }]
        };
        let (x, s) = (Ask::one(Mode::Exclusive), Ask::one(Mode::Shared));
        assert!(Chain::of(&declared(1), x, behind()).is_some());
        assert!(Chain::of(&declared(1), x, vec![]).is_none());
        assert!(Chain::of(&declared(1), s, behind()).is_none());
        let slot = Chain::of(&declared(2), x, behind());
        assert!(slot.is_some(), "a semaphore's holder hands its slot on");
    }

    /// The model's "permits ignored by a handoff": a hold of 1 handing its slot to a request
    /// of 2 puts 2 more permits beside the holds ahead, which left room for 1.
    #[test]
    fn a_weighted_hold_hands_on_only_to_a_request_no_larger() {
        let asking = |permits| {
            vec![Successor {
                key: "k".into(),
                revision: 9,
                entry: Entry {
                    permits,
                    ..entry(Mode::Exclusive)
                },
            }]
        };
        let holding = |permits| Ask {
            mode: Mode::Exclusive,
            permits,
        };
        assert!(Chain::of(&declared(3), holding(1), asking(2)).is_none());
        assert!(Chain::of(&declared(3), holding(2), asking(2)).is_some());
        assert!(Chain::of(&declared(3), holding(2), asking(1)).is_some());
    }

    /// A multi-lock key holds only once admitted on every lock of its set: a release must
    /// never hand it a grant (a chain read stops at it, as at a shared key).
    #[test]
    fn a_multi_lock_key_is_never_handed_a_grant() {
        let may_be_handed = |e: &Entry| rule::may_be_handed(party(e));
        assert!(may_be_handed(&entry(Mode::Exclusive)));
        assert!(!may_be_handed(&entry(Mode::Shared)));
        let set = Entry {
            with: vec!["other".into()],
            ..entry(Mode::Exclusive)
        };
        assert!(!may_be_handed(&set));
    }

    #[test]
    fn an_entry_without_a_handoff_encodes_as_before() {
        let plain = String::from_utf8(entry(Mode::Exclusive).encode()).unwrap();
        assert!(!plain.contains("handed") && !plain.contains("next"), "{plain}");
        let handed = Entry {
            handed: true,
            next: vec![Successor {
                key: "k2".into(),
                revision: 12,
                entry: entry(Mode::Exclusive),
            }],
            ..entry(Mode::Exclusive)
        };
        let back = Entry::decode(&handed.encode()).expect("decodes");
        assert!(
            back.handed && !back.is_granted(),
            "a handoff is not a grant record"
        );
        assert_eq!((back.next[0].key.as_str(), back.next[0].revision), ("k2", 12));
    }
}
