//! Marks on a handoff's critical path, for `cargo bench --bench handoff` (bench/README.md,
//! "A handoff's critical path"): one trace event per point a handoff passes, stamped with the
//! machine-wide monotonic clock, so that the benchmark lines up the releaser's sidecar, the
//! waiter's and its own HTTP clients on one time line.
//!
//! Off unless `PODLOCK_LOG` enables the target `podlock::path` at trace level: a disabled
//! event costs one cached check, and the clock is read only when the event is on.

/// The points a handoff passes, in order.
#[derive(Debug, Clone, Copy)]
pub enum Point {
    /// The releaser's sidecar began to handle `POST .../release`.
    ReleaseRequest,
    /// It sent the release's transaction to etcd.
    ReleaseSent,
    /// etcd answered that it handed the lock on (`revision`: the release's); a release that
    /// could not hand it on makes no mark.
    ReleaseHanded,
    /// A waiter's sidecar had a watch event (`revision`: the newest among the events).
    WaitEvent,
    /// The waiter's sidecar handed its grant to the HTTP server.
    GrantAnswered,
}

impl Point {
    fn name(self) -> &'static str {
        match self {
            Point::ReleaseRequest => "release.request",
            Point::ReleaseSent => "release.sent",
            Point::ReleaseHanded => "release.handed",
            Point::WaitEvent => "wait.event",
            Point::GrantAnswered => "grant.answered",
        }
    }
}

/// Whether marks are on.
fn on() -> bool {
    tracing::enabled!(target: "podlock::path", tracing::Level::TRACE)
}

/// The time now for a mark made later ([`mark_at`]), when marks are on.
pub fn now() -> Option<i64> {
    on().then(monotonic_ns)
}

/// Marks `point` now, for the queue key with create revision `token` (0: not known there) at
/// etcd revision `revision` (0: none).
pub fn mark(point: Point, token: i64, revision: i64) {
    if on() {
        mark_at(point, token, revision, Some(monotonic_ns()));
    }
}

/// Marks `point` at `at` (from [`now`]; nothing when `None`).
pub fn mark_at(point: Point, token: i64, revision: i64, at: Option<i64>) {
    if let Some(at) = at {
        tracing::trace!(target: "podlock::path", point = point.name(), token, revision, at);
    }
}

/// Nanoseconds on CLOCK_MONOTONIC: one clock for every process of the machine (`Instant`
/// reads the same clock, but keeps it opaque).
pub fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}
