//! Printing states and paths for a person: one line per lock, pod and client.

use std::fmt::{self, Display, Formatter, Write};

use crate::model::{Protocol, Steps};
use crate::state::{Key, Phase, Record, State};

/// A state as `model` names its parts.
pub struct Shown<'a>(pub &'a Protocol, pub &'a State);

impl Display for Shown<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Shown(model, s) = self;
        for (l, lock) in s.locks.iter().enumerate() {
            let settings = match lock.modrev {
                0 => "deleted".to_string(),
                r => format!("maxHolders {} epoch {} @{r}", lock.max, lock.epoch),
            };
            let queue: Vec<_> = lock.queue.iter().map(key).collect();
            writeln!(
                f,
                "    lock {l}: {settings}; queue [{}]; last token {}",
                queue.join(" "),
                token(lock.last_token)
            )?;
            if let Some(r) = &s.rebuilt {
                let status = r.status[l];
                let restored = match status.unreconciled {
                    true => ", restored, not reconciled",
                    false => "",
                };
                writeln!(
                    f,
                    "      status: fencingEpoch {} fencingToken {}{restored}",
                    status.epoch,
                    token(status.token)
                )?;
            }
        }
        if let Some(r) = &s.rebuilt {
            let snapshot = if r.snapshot.is_some() {
                "; a snapshot taken"
            } else {
                ""
            };
            writeln!(f, "    etcd at @{}{snapshot}", s.etcd)?;
        }
        for (p, pod) in s.pods.iter().enumerate() {
            let lease = if pod.lease { "live" } else { "ended" };
            let crashed = if pod.crashed { ", crashed" } else { "" };
            writeln!(f, "    pod {p}: session {} {lease}{crashed}", pod.session)?;
        }
        for (c, client) in s.clients.iter().enumerate() {
            let spec = model.spec.clients[c];
            let mode = if spec.shared { "shared" } else { "exclusive" };
            let locks: Vec<_> = spec.locks().map(|l| l.to_string()).collect();
            let mut line = format!(
                "    c{c} ({mode}, lock {}): {}",
                locks.join("+"),
                phase(&client.phase)
            );
            if !client.removals.is_empty() {
                write!(line, "; removing {:?}", client.removals)?;
            }
            writeln!(
                f,
                "{line}; knows maxHolders {} epoch {} @{}",
                client.cache.max, client.cache.epoch, client.cache.modrev
            )?;
        }
        if let Some(broken) = s.broken {
            writeln!(f, "    broken: {broken:?}")?;
        }
        if s.rebuilt.as_ref().is_some_and(|r| r.window_broken) {
            writeln!(
                f,
                "    broken: a token below an earlier one before the operator's reconcile"
            )?;
        }
        if s.rebuilt.as_ref().is_some_and(|r| r.reuse_broken) {
            writeln!(
                f,
                "    broken: a token below an earlier one under an epoch published again"
            )?;
        }
        Ok(())
    }
}

fn key(k: &Key) -> String {
    let mode = if k.shared { "S" } else { "E" };
    let record = match k.record {
        Record::No => "",
        Record::Own => " granted",
        Record::Behalf => " granted-on-behalf",
        Record::Handed => " handed",
    };
    let next = match k.next.is_empty() {
        true => String::new(),
        false => format!(", then {:?}", k.next),
    };
    let asked = if k.yielding { " asked to yield" } else { "" };
    format!(
        "c{}:{mode}#{} (epoch {}, mod {}){record}{asked}{next}",
        k.owner, k.create, k.epoch, k.modrev
    )
}

/// A token as epoch.revision.
fn token((epoch, rev): crate::state::Token) -> String {
    format!("{epoch}.{rev}")
}

fn phase(p: &Phase) -> String {
    match p {
        Phase::Idle => "idle".into(),
        Phase::Enqueue => "enqueueing".into(),
        Phase::Requeue { old } => format!("removing its old key #{old}, then enqueueing"),
        Phase::Reading { ticket } => format!("reading the position of #{ticket}"),
        Phase::Releasing { ticket, own, .. } => {
            let did = if *own { "deleted" } else { "found gone" };
            format!("released #{ticket} ({did} by its first copy), awaiting the copy sent again")
        }
        Phase::Holding {
            ticket,
            recorded,
            chain,
            ..
        } => {
            let recorded = if *recorded { " (recorded)" } else { "" };
            format!("holds #{ticket}{recorded}, knows {chain:?} behind it")
        }
        Phase::Waiting(w) => {
            let wakes: Vec<_> = (w.wakes.iter())
                .map(|(l, k, any)| format!("lock {l} #{k} {}", if *any { "any change" } else { "deletion" }))
                .collect();
            let behalf = match w.behind {
                Some((c, _, _)) => format!("; may record c{c}'s grant"),
                None => String::new(),
            };
            let turns: String = (w.turns.iter())
                .map(|t| format!("; lock {} {:?} @{}", t.lock, t.turn, t.at))
                .collect();
            format!(
                "waits with #{} (read @{}) for [{}]{behalf}{turns}",
                w.ticket,
                w.at,
                wakes.join(", ")
            )
        }
    }
}

/// A path: each step, with the state after it if `full`, else only the state it ends in.
pub fn path(model: &Protocol, start: &State, steps: &Steps, full: bool) -> String {
    let mut out = format!("  start:\n{}", Shown(model, start));
    for (i, (action, state)) in steps.iter().enumerate() {
        let _ = writeln!(out, "  {}. {action:?}", i + 1);
        if full || i + 1 == steps.len() {
            let _ = write!(out, "{}", Shown(model, state));
        }
    }
    out
}
