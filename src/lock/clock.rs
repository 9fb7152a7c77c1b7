//! The engine's wall clock: the times it writes (`acquiredAt`, `requestedAt`, event times) and
//! the maximum hold deadline it derives from them. It is the system's, except on a thread that
//! runs the seeded world (`tests/sim`), where it runs on Tokio's clock from a fixed start, so
//! that a seed's run does not depend on when, or how fast, it runs. Every wall-clock read of
//! the engine goes through [`now`]; the world's source check holds the engine to it.

use std::cell::Cell;
use std::time::SystemTime;
use tokio::time::Instant;

thread_local! {
    /// On a thread of the seeded world: the wall time its clock started at, and when on
    /// Tokio's clock.
    static ON_TOKIO: Cell<Option<(SystemTime, Instant)>> = const { Cell::new(None) };
}

/// The wall-clock time now.
pub fn now() -> SystemTime {
    match ON_TOKIO.get() {
        Some((wall, at)) => wall + at.elapsed(),
        None => SystemTime::now(),
    }
}

/// Makes this thread's wall clock run on Tokio's clock, from `wall` at this moment: for the
/// seeded world, on a current-thread runtime with paused time.
pub fn run_on_tokio(wall: SystemTime) {
    ON_TOKIO.set(Some((wall, Instant::now())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_clock_on_tokio_moves_with_tokio_time_only() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        run_on_tokio(start);
        assert_eq!(now(), start);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(now(), start + Duration::from_secs(5));
    }
}
