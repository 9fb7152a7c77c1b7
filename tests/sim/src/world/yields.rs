//! A client's answer to a `yield` event (an administrator asked its hold to yield, `admin.rs`):
//! three times in four it releases within the first three quarters of the grace, as an app
//! given SIGTERM by `podlock lock` would; otherwise it ignores the request, and the operator
//! ends the hold at the deadline (`backstop.rs`), which its client hears as `lost`.

use super::World;
use podlock::lock::{Engine, HoldEvent, clock};
use std::time::Duration;
use tokio::time::sleep;

/// Answers `e`, a `yield` event of `engine`'s.
pub fn heard(engine: &Engine, world: &World, e: HoldEvent) {
    let by = e
        .deadline
        .as_deref()
        .and_then(|d| humantime::parse_rfc3339(d).ok());
    let grace = by
        .and_then(|by| by.duration_since(clock::now()).ok())
        .unwrap_or_default();
    let (heeds, after) = world.with(|s| {
        let heeds = !s.ops.rng.one_in(4);
        let quarters = grace.as_millis() as u64 * 3 / 4;
        (heeds, Duration::from_millis(s.ops.rng.between(0, quarters)))
    });
    let (holder, token) = (e.holder_id.clone(), e.fencing_token);
    if !heeds {
        return world.log(format!("{holder} ignores the request to yield {token}"));
    }
    world.log(format!("{holder} yields {token} in {after:?}"));
    let (engine, world) = (engine.clone(), world.clone());
    tokio::spawn(async move {
        sleep(after).await;
        world.releasing(&holder, &e.lock.name, token);
        match engine.release_token(&e.lock, &holder, token).await {
            Ok(()) => world.released_hold(&holder, &e.lock.name, token),
            Err(e) => world.log(format!("{holder} release {token} (yielding): {e}")),
        }
    });
}
