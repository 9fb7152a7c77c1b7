//! A key's position, decided by the engine's own function (`podlock::lock::protocol`) on what
//! an etcd read of the model's store returns, and what a grant must respect.

use podlock::lock::protocol::{self, Ahead, Ask, Mode, Position, Queued, WakeOn};

use crate::model::Protocol;
use crate::spec::Bug;
use crate::state::{Broken, Key, Phase, Record, Rev, State, Wait};

/// A model key's name in etcd: its create revision (unique, and all the model needs to
/// address it).
fn name(create: Rev) -> [u8; 2] {
    create.to_be_bytes()
}

fn create_of(name: &[u8]) -> Rev {
    Rev::from_be_bytes(name.try_into().expect("a model key name"))
}

fn mode(shared: bool) -> Mode {
    if shared { Mode::Shared } else { Mode::Exclusive }
}

/// What `key` asks of its lock, as the rule sees it (through an injected bug, if any).
fn ask(model: &Protocol, key: &Key, bug: Option<Bug>) -> Ask {
    Ask {
        mode: mode(key.shared && bug != Some(Bug::IgnoreModes)),
        permits: match bug {
            Some(Bug::CountNotWeight) => 1,
            _ => model.permits(key.owner).into(),
        },
    }
}

/// What a position read of a key returns: the keys ahead of it, nearest first, as many as
/// the engine reads, as the engine sees them (through an injected bug, if any).
struct Read<'a> {
    model: &'a Protocol,
    keys: Vec<&'a Key>,
    names: Vec<[u8; 2]>,
    more: bool,
    values: bool,
    own: Ask,
    max: u32,
    bug: Option<Bug>,
}

impl<'a> Read<'a> {
    fn new(
        model: &'a Protocol,
        state: &'a State,
        (lock, ticket): (u8, Rev),
        max: u8,
        bug: Option<Bug>,
    ) -> Self {
        let me = state.key(lock, ticket).expect("a key in place");
        let own = ask(model, me, bug);
        let (needed, values) = protocol::keys_needed(max.into(), own.mode);
        let queue = &state.locks[lock as usize].queue;
        let mut keys: Vec<_> = queue.iter().filter(|k| k.create < ticket).rev().collect();
        let more = keys.len() > needed as usize;
        keys.truncate(needed as usize);
        let names = keys.iter().map(|k| name(k.create)).collect();
        let max = max.into();
        Read {
            model,
            keys,
            names,
            more,
            values,
            own,
            max,
            bug,
        }
    }

    /// The engine's verdict on this read (`assumed`: the keys ahead counted as recorded even
    /// if they are not).
    fn position(&self, assumed: impl Fn(&Key) -> bool) -> Position {
        let bug = self.bug;
        let ahead: Vec<_> = (self.keys.iter().zip(&self.names))
            .map(|(k, n)| match self.values {
                false => Ahead::without_value(n.to_vec()),
                true => Ahead {
                    key: n.to_vec(),
                    mode: ask(self.model, k, bug).mode,
                    permits: ask(self.model, k, bug).permits,
                    granted: assumed(k) || recorded(k.record, bug) || bug == Some(Bug::GrantPastUngranted),
                },
            })
            .filter(|a| a.granted || bug != Some(Bug::SmallerPasses))
            .collect();
        protocol::position(&ahead, self.more, self.max, self.own)
    }
}

/// Whether a key ahead counts as recorded for the rule: by its owner (or on behalf), not by
/// a handoff its owner has yet to learn of.
fn recorded(record: Record, bug: Option<Bug>) -> bool {
    match record {
        Record::Own | Record::Behalf => true,
        Record::Handed => bug == Some(Bug::HandedCountsAsGranted),
        Record::No => false,
    }
}

/// What a position read (or the enqueue's read) of `ticket` in `lock` decides, under
/// `max_holders`: `Ok` to hold, or `Err` with what the waiter watches and may record (`None`:
/// refused, it asks for more permits than `max_holders`).
pub fn decide(model: &Protocol, state: &State, at: (u8, Rev), max: u8) -> Result<(), Option<Wait>> {
    let read = Read::new(model, state, at, max, model.spec.bug);
    let position = read.position(|_| false);
    match position {
        Position::Holder => return Ok(()),
        Position::TooLarge => return Err(None),
        _ => {}
    }
    let predecessor_deletion =
        read.bug == Some(Bug::PredecessorDeletionOnly) && matches!(position, Position::Waiter(_));
    let wakes = (protocol::wakes(&position, max.into()).into_iter())
        .map(|(key, on)| (at.0, create_of(&key), on == WakeOn::Any && !predecessor_deletion))
        .collect();
    // Behind a grant its owner has not recorded: the waiter may record it (see `OnBehalf`).
    let behind = match &position {
        Position::BehindUngranted(key) => state.key(at.0, create_of(key)).map(|k| k.name()),
        _ => None,
    };
    Err(Some(Wait {
        ticket: at.1,
        at: state.etcd,
        wakes,
        behind,
        turns: vec![],
    }))
}

/// Whether the waiter `client` would hold its locks by the rule, applied to etcd as it is now
/// (its settings, and every key ahead counted as recorded, but a multi-lock waiter's, which
/// records only once admitted on all its locks): nothing but the recording of the grants
/// ahead and its own read need happen before it holds, whatever it last read.
pub fn admissible(model: &Protocol, state: &State, client: u8) -> bool {
    let ticket = match &state.clients[client as usize].phase {
        Phase::Waiting(w) => w.ticket,
        Phase::Reading { ticket } => *ticket,
        _ => return false,
    };
    let waiting_multi = |k: &Key| {
        let owner = &state.clients[k.owner as usize];
        let holds = matches!(owner.phase, Phase::Holding { ticket, .. } if ticket == k.create);
        model.spec.clients[k.owner as usize].also.is_some() && !holds
    };
    model.spec.clients[client as usize].locks().all(|lock| {
        let l = &state.locks[lock as usize];
        let in_place = state.key(lock, ticket).is_some() && l.modrev != 0;
        in_place
            && Read::new(model, state, (lock, ticket), l.max, None).position(|k| !waiting_multi(k))
                == Position::Holder
    })
}

/// Notes a grant of an exclusive key asking `permits` in `lock` that breaks the limit: its
/// permits and those of the holders granted before whose keys are still there must fit in the
/// `maxHolders` in force (holders let in under a higher limit may stay, but then nobody new is
/// let in; shared holders have no limit).
pub fn check_limit(model: &Protocol, state: &mut State, lock: u8, permits: u8) {
    let handed_waiters = (0..state.clients.len()).filter(|&c| {
        let ticket = match &state.clients[c].phase {
            Phase::Waiting(w) => w.ticket,
            Phase::Reading { ticket } => *ticket,
            _ => return false,
        };
        let handed = state
            .key(lock, ticket)
            .is_some_and(|k| k.record == Record::Handed);
        handed && model.spec.clients[c].locks().any(|l| l == lock)
    });
    let taken: u32 = (live_holders(model, state, lock).chain(handed_waiters.map(|c| c as u8)))
        .map(|c| u32::from(model.permits(c)))
        .sum();
    if taken + u32::from(permits) > state.locks[lock as usize].max.into() {
        state.broken.get_or_insert(Broken::Limit);
    }
}

/// Makes `client` a holder of `ticket` in `lock`, noting a grant that breaks a safety rule:
/// the count rule ([`check_limit`]; a grant handed on by a release was checked when the
/// release wrote it, under the `maxHolders` then in force), and its token must be above
/// every token granted before, across wipes and restores (one granted after a restore the
/// operator has not reconciled yet is noted apart, see
/// [`crate::state::Rebuilt::window_broken`]).
pub fn grant(model: &Protocol, state: &mut State, (client, lock): (u8, u8), ticket: Rev, chain: Vec<Rev>) {
    check_grant(model, state, (client, lock), ticket);
    hold(model, state, client, ticket, chain);
}

/// Notes whether the grant of `ticket` in `lock` to `client` breaks a safety rule (see
/// [`grant`]).
pub fn check_grant(model: &Protocol, state: &mut State, (client, lock): (u8, u8), ticket: Rev) {
    let key = state.key(lock, ticket).expect("a key in place");
    if !model.spec.clients[client as usize].shared && key.record != Record::Handed {
        check_limit(model, state, lock, model.permits(client));
    }
    let l = &state.locks[lock as usize];
    let token = state.key(lock, ticket).expect("a key in place").token();
    let below = token <= l.last_token;
    let l = &mut state.locks[lock as usize];
    l.last_token = l.last_token.max(token);
    match state.rebuilt.as_deref_mut() {
        Some(r) => {
            let status = &mut r.status[lock as usize];
            r.window_broken |= below && status.unreconciled;
            r.floor_broken |= token.0 < state.clients[client as usize].seen;
            r.reuse_broken |= below && r.reused;
            if below && !status.unreconciled && !r.reused {
                state.broken.get_or_insert(Broken::TokenOrder);
            }
            if !model.spec.status_lag {
                status.token = status.token.max(token);
            }
            r.granted_after |= r.left == 0;
            r.granted_recreated |= r.recreated && token.0 >= 1;
        }
        None if below => drop(state.broken.get_or_insert(Broken::TokenOrder)),
        None => {}
    }
}

/// Makes `client` a holder of `ticket`, knowing `chain` behind it.
pub fn hold(model: &Protocol, state: &mut State, client: u8, ticket: Rev, chain: Vec<Rev>) {
    let session = state.pods[model.owners[client as usize] as usize].session;
    state.clients[client as usize].phase = Phase::Holding {
        ticket,
        session,
        recorded: false,
        chain,
    };
}

/// The clients that hold `lock` and whose keys are still in place.
pub fn live_holders<'a>(model: &'a Protocol, state: &'a State, lock: u8) -> impl Iterator<Item = u8> + 'a {
    (0..state.clients.len() as u8).filter(move |&c| {
        let holds = match state.clients[c as usize].phase {
            Phase::Holding { ticket, .. } => state.key(lock, ticket).is_some(),
            _ => false,
        };
        holds && model.spec.clients[c as usize].locks().any(|l| l == lock)
    })
}

/// The keys of `lock` that hold, in queue order, as every view of the holders names them
/// (status, `GET`, the holder Service, the fence check, a force release): by the engine's one
/// rule of who holds, `protocol::holders` (or, with [`Bug::ViewsByPosition`], by the rule the
/// views used before it).
pub fn named<'a>(model: &Protocol, state: &'a State, lock: u8) -> Vec<&'a Key> {
    let l = &state.locks[lock as usize];
    let queue: Vec<Queued> = (l.queue.iter())
        .map(|k| Queued {
            ask: ask(model, k, None),
            recorded: matches!(k.record, Record::Own | Record::Behalf),
            handed: k.record == Record::Handed,
            set: model.spec.clients[k.owner as usize].also.is_some(),
        })
        .collect();
    let held = match model.spec.bug {
        Some(Bug::ViewsByPosition) => by_position(&queue, l.max),
        _ => protocol::holders(&queue, l.max.into()),
    };
    l.queue.iter().take(held).collect()
}

/// The injected bug [`Bug::ViewsByPosition`]: holders counted by position, the leading run of
/// one mode within `max` (shared keys without a limit), up to the first multi-lock key that
/// has not recorded its grant: what status, `GET` and a force release did before the one rule.
fn by_position(queue: &[Queued], max: u8) -> usize {
    let Some(first) = queue.first().map(|q| q.ask.mode) else {
        return 0;
    };
    let limit = if first == Mode::Shared {
        usize::MAX
    } else {
        max.into()
    };
    (queue.iter().take(limit))
        .take_while(|q| q.ask.mode == first && (q.recorded || !q.set))
        .count()
}
