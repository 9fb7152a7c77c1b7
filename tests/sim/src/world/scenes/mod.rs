//! Scenes: a finding's interleaving played step by step in the world (its pods, its way of
//! declaring locks), where a seed would meet it only by chance. Each scene runs on a paused
//! current-thread runtime of its own and holds the simulated etcd where the finding needs a
//! moment between two of the engine's requests ([`Etcd::hold_next_watch`],
//! [`Etcd::hold_next_txn`]); on real etcd that
//! moment is a few hundred microseconds. A scene that fails prints its trace's end
//! (`PODLOCK_WORLD_LOG` adds the engine's log lines, as in the world).

mod feeds;
mod handed;
mod late;
mod releases;

use super::operator::declare;
use super::{LockSpec, NAMESPACE, TAIL, World, logs};
use crate::etcd::{Config, Etcd};
use podlock::lock::{AcquireRequest, Grant, LockError, LockId, Mode, Store};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// What a scene plays, to its end or to the first thing that went otherwise.
type Play = fn(World, Arc<Etcd>) -> Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// The scenes, by name.
const SCENES: &[(&str, Play)] = &[
    (
        "a limit raised before a waiter's new feed starts (#54 F1)",
        |world, etcd| Box::pin(feeds::limit_raised_before_a_new_feed(world, etcd)),
    ),
    (
        "a waiter on a quiet etcd 3.6 keeps its watches (#55 F15)",
        |world, etcd| Box::pin(feeds::quiet_waiter_keeps_its_watches(world, etcd)),
    ),
    (
        "two releases of one hold while its pod is deaf (#54 F14)",
        |world, etcd| Box::pin(releases::two_releases_of_one_hold(world, etcd)),
    ),
    (HANDED_NOT_RECORDED, |world, etcd| {
        Box::pin(handed::handed_not_recorded(world, etcd))
    }),
    (HANDED_THEN_LOWERED, |world, etcd| {
        Box::pin(handed::handed_then_lowered(world, etcd))
    }),
    (LATE_COPY, |world, etcd| Box::pin(late::late_copy(world, etcd))),
];

/// The scene of a handed grant its owner has not yet recorded (the bug `HandedCountsAsGranted`).
pub const HANDED_NOT_RECORDED: &str = "a key behind a handed grant not yet recorded waits";

/// The scene of a handed grant its owner learns by a read after a lowering (#54 F10, the bug
/// `ReadIgnoresHanded`).
pub const HANDED_THEN_LOWERED: &str = "a grant handed before a lowering, learnt by a read, holds (#54 F10)";

/// The scene of an enqueue's copy applied after its hold ended (the bug `LateCopyUnguarded`).
pub const LATE_COPY: &str = "a late copy of an enqueue is removed at once";

/// Scenes that fail on the engine as it is, kept out of the default run until it is fixed;
/// `PODLOCK_SCENES_KNOWN=1` plays them too.
const KNOWN: &[&str] = &[];

/// Plays every scene (with `PODLOCK_SCENES_KNOWN=1`, those of `KNOWN` too); the first that
/// fails fails the test with its trace's end.
pub fn run() -> Result<(), String> {
    let known = std::env::var("PODLOCK_SCENES_KNOWN").is_ok_and(|v| v == "1");
    let mut played = 0;
    for &(name, _) in SCENES {
        if KNOWN.contains(&name) && !known {
            continue;
        }
        play(name)?;
        played += 1;
    }
    println!(
        "sim scenes: {played} played as they should{}",
        match SCENES.len() - played {
            0 => String::new(),
            n => format!(", {n} known to fail left out (PODLOCK_SCENES_KNOWN=1 plays them)"),
        }
    );
    Ok(())
}

/// Plays the scene `name` on a paused runtime of its own; fails with its trace's end if it, or
/// the admission checker (`admission.rs`), finds something wrong.
pub fn play(name: &str) -> Result<(), String> {
    let (_, scene) = *SCENES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("a scene of that name");
    let runtime = crate::paused_runtime();
    fastrand::seed(1);
    let (trace, failure) = runtime.block_on(async {
        let etcd = Arc::new(Etcd::start(Config::default()));
        let world = World::new(etcd.clone());
        let _logs = logs::capture(&world);
        let failure = scene(world.clone(), etcd).await.err();
        let admission = world.with(|s| s.admission.lock().unwrap().failure.take());
        (
            world.with(|s| std::mem::take(&mut s.trace)),
            failure.or(admission),
        )
    });
    let Some(failure) = failure else { return Ok(()) };
    let tail = &trace[trace.len().saturating_sub(TAIL)..];
    Err(format!(
        "sim scenes: {name}: {failure}\nreplay: PODLOCK_SIM_PART=scenes PODLOCK_SCENES_KNOWN=1 \
         cargo test --test sim\nthe trace's last {} lines:\n{}",
        tail.len(),
        tail.join("\n")
    ))
}

/// A mutex, whose `maxHolders` a scene may raise.
const MUTEX: LockSpec = LockSpec {
    name: "m",
    max_holders: 1,
    heartbeat: 0,
    shared: false,
};

/// How long a scene gives a waiter to be let in once it may be: far more than the few
/// milliseconds of simulated time a grant takes, far less than its wait.
const LET_IN: Duration = Duration::from_secs(2);

/// A store on `etcd` with `spec` declared at `max_holders`, and the lock's id.
async fn declared(etcd: &Etcd, spec: &LockSpec, max_holders: u32) -> Result<(Store, LockId), String> {
    let store = Store::new(etcd.client().await);
    declare(&store, spec, max_holders)
        .await
        .map_err(|e| format!("declare: {e}"))?;
    Ok((store, LockId::new(NAMESPACE, spec.name).expect("a valid name")))
}

/// An exclusive acquire of one permit.
fn request(lock: &LockId, holder: &str, wait: Duration) -> AcquireRequest {
    AcquireRequest {
        lock: lock.clone(),
        holder_id: holder.into(),
        wait,
        ttl_seconds: None,
        heartbeat_timeout_seconds: None,
        max_hold_seconds: None,
        deadline_warning_seconds: None,
        container: None,
        mode: Mode::Exclusive,
        permits: 1,
        connection_bound: false,
        with: Vec::new(),
    }
}

/// The grant `acquire` is answered with within `within` (else, what it is answered later).
async fn let_in(
    world: &World,
    who: &str,
    mut acquire: JoinHandle<Result<Grant, LockError>>,
    within: Duration,
) -> Result<Grant, String> {
    let (answer, late) = match timeout(within, &mut acquire).await {
        Ok(answer) => (answer, false),
        Err(_) => (acquire.await, true),
    };
    let answer = match answer {
        Ok(Ok(grant)) => Ok(grant),
        Ok(Err(e)) => Err(format!("refused: {e}")),
        Err(e) => Err(format!("the acquire panicked: {e}")),
    };
    match (answer, late) {
        (Ok(grant), false) => {
            world.log(format!("{who}: granted token {}", grant.fencing_token));
            Ok(grant)
        }
        (Err(e), false) => Err(format!("{who}: {e}")),
        (answer, true) => {
            let then = answer.map_or_else(|e| e, |g| format!("granted token {}", g.fencing_token));
            Err(format!("{who}: not let in within {within:?}; later {then}"))
        }
    }
}
