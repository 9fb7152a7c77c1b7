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
                r => format!("maxHolders {} @{r}", lock.max),
            };
            let queue: Vec<_> = lock.queue.iter().map(key).collect();
            writeln!(
                f,
                "    lock {l}: {settings}; queue [{}]; last token {}",
                queue.join(" "),
                lock.last_token
            )?;
        }
        for (p, pod) in s.pods.iter().enumerate() {
            let lease = if pod.lease { "live" } else { "ended" };
            let crashed = if pod.crashed { ", crashed" } else { "" };
            writeln!(f, "    pod {p}: lease epoch {} {lease}{crashed}", pod.epoch)?;
        }
        for (c, client) in s.clients.iter().enumerate() {
            let spec = model.spec.clients[c];
            let mode = if spec.shared { "shared" } else { "exclusive" };
            let mut line = format!("    c{c} ({mode}, lock {}): {}", spec.lock, phase(&client.phase));
            if !client.removals.is_empty() {
                write!(line, "; removing {:?}", client.removals)?;
            }
            writeln!(
                f,
                "{line}; knows maxHolders {} @{}",
                client.cache.max, client.cache.modrev
            )?;
        }
        if let Some(broken) = s.broken {
            writeln!(f, "    broken: {broken:?}")?;
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
    };
    format!("c{}:{mode}#{} (mod {}){record}", k.owner, k.create, k.modrev)
}

fn phase(p: &Phase) -> String {
    match p {
        Phase::Idle => "idle".into(),
        Phase::Enqueue => "enqueueing".into(),
        Phase::Requeue { old } => format!("removing its old key #{old}, then enqueueing"),
        Phase::Reading { ticket } => format!("reading the position of #{ticket}"),
        Phase::Holding { ticket, recorded, .. } => {
            format!("holds #{ticket}{}", if *recorded { " (recorded)" } else { "" })
        }
        Phase::Waiting(w) => {
            let wakes: Vec<_> = (w.wakes.iter())
                .map(|(k, any)| format!("#{k} {}", if *any { "any change" } else { "deletion" }))
                .collect();
            let behalf = match w.behind {
                Some((c, _, _)) => format!("; may record c{c}'s grant"),
                None => String::new(),
            };
            format!(
                "waits with #{} (read @{}) for [{}]{behalf}",
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
