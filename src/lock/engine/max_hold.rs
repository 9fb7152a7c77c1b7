//! A hold's maximum hold time (`maxHoldSeconds`): how long a hold may last, what a request may
//! ask for under its lock's limit, and when the hold is warned before its deadline. Pure rules;
//! the monitor ends the hold (`life/deadline.rs`) and the operator ends one whose sidecar did
//! not (`operator/reconcile/deadline.rs`).

use std::time::{Duration, SystemTime};
use tokio::time::Instant;

use crate::lock::clock;
use crate::lock::error::LockError;
use crate::lock::messages::AcquireRequest;
use crate::lock::protocol::names::LockId;
use crate::lock::txn::settings::MAX_HOLD;

/// The bounds of `maxHoldSeconds` on a request: at least a second, at most what a lock may
/// allow.
pub const REQUEST_MAX_HOLD: std::ops::RangeInclusive<u32> = 1..=MAX_HOLD.max;

/// The field that asks for the warning's lead time.
pub const WARNING_FIELD: &str = "deadlineWarningSeconds";

/// The least lead time of the `deadline` warning: a warning later than this leaves an app no
/// time to stop.
const MIN_WARNING: Duration = Duration::from_secs(1);

/// What an acquire asks for and its locks allow: the maximum hold time (0: none) and the
/// warning's lead time, decided when its key is put.
#[derive(Debug, Clone, Copy)]
pub struct MaxHold {
    /// The maximum hold time, in seconds; 0: none.
    pub seconds: u32,
    /// How long before the deadline the `deadline` event comes.
    pub warning: Duration,
}

impl MaxHold {
    /// The maximum hold time of `req` on the locks `limits` (each with its
    /// `spec.maxHoldSeconds`), checked: a request for more than a lock allows is refused.
    pub fn of(req: &AcquireRequest, limits: &[(&LockId, u32)]) -> Result<Self, LockError> {
        let seconds = resolve(req.max_hold_seconds, limits)?;
        let warning = warning(seconds, req.deadline_warning_seconds)?;
        Ok(MaxHold { seconds, warning })
    }

    /// The deadline of a hold granted at `granted` (`None`: no maximum hold time).
    pub fn start(&self, granted: SystemTime) -> Option<Deadline> {
        Deadline::start(self.seconds, self.warning, granted)
    }
}

/// The maximum hold time of a hold of the locks `limits` (each lock with its
/// `spec.maxHoldSeconds`, 0: none) that asks for `asked`: the request's if it asks (at most
/// every lock's limit), else the strictest limit; 0: none.
fn resolve(asked: Option<u32>, limits: &[(&LockId, u32)]) -> Result<u32, LockError> {
    let set = limits.iter().filter(|(_, l)| *l > 0);
    let Some(asked) = asked else {
        return Ok(set.map(|(_, l)| *l).min().unwrap_or(0));
    };
    if let Some((lock, limit)) = set.clone().find(|(_, l)| asked > *l) {
        return Err(LockError::AboveMaxHold {
            lock: (*lock).clone(),
            asked,
            limit: *limit,
        });
    }
    Ok(asked)
}

/// The warning's lead time for a hold of `max_hold` seconds: `asked` (at most the hold
/// itself), else a tenth of the hold, at least [`MIN_WARNING`].
fn warning(max_hold: u32, asked: Option<u32>) -> Result<Duration, LockError> {
    let hold = Duration::from_secs(max_hold.into());
    match asked {
        None => Ok((hold / 10).max(MIN_WARNING)),
        Some(_) if max_hold == 0 => Err(LockError::Invalid(format!(
            "{WARNING_FIELD} needs a maximum hold time: ask for maxHoldSeconds, or acquire a lock \
             whose spec.maxHoldSeconds is set"
        ))),
        Some(w) if w == 0 || w > max_hold => Err(LockError::Invalid(format!(
            "{WARNING_FIELD} must be between 1 and the hold's maxHoldSeconds ({max_hold}), got {w}"
        ))),
        Some(w) => Ok(Duration::from_secs(w.into())),
    }
}

/// The deadline of a hold with a maximum hold time, fixed at its grant.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    /// The maximum hold time, in seconds.
    pub seconds: u32,
    /// How long before the deadline the `deadline` event comes.
    pub warning: Duration,
    /// When the hold ends, on this process's clock.
    pub at: Instant,
    /// The same on the wall clock, as the grant and the events state it.
    pub wall: SystemTime,
}

impl Deadline {
    /// The deadline of a hold of `seconds` (0: none) granted at `granted`.
    fn start(seconds: u32, warning: Duration, granted: SystemTime) -> Option<Self> {
        let hold = Duration::from_secs(seconds.into());
        let since = clock::now().duration_since(granted).unwrap_or_default();
        (seconds > 0).then(|| Deadline {
            seconds,
            warning,
            at: Instant::now() + hold.saturating_sub(since),
            wall: granted + hold,
        })
    }

    /// When the `deadline` event is due.
    pub fn warn_at(&self) -> Instant {
        self.at.checked_sub(self.warning).unwrap_or(self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(name: &str) -> LockId {
        LockId::new("ns", name).unwrap()
    }

    #[test]
    fn a_request_gets_what_it_asks_within_every_limit_else_the_strictest() {
        let (a, b) = (lock("a"), lock("b"));
        assert_eq!(resolve(None, &[(&a, 0)]).unwrap(), 0);
        assert_eq!(resolve(None, &[(&a, 60), (&b, 0)]).unwrap(), 60);
        assert_eq!(resolve(None, &[(&a, 60), (&b, 30)]).unwrap(), 30);
        assert_eq!(resolve(Some(90), &[(&a, 0)]).unwrap(), 90);
        assert_eq!(resolve(Some(30), &[(&a, 60)]).unwrap(), 30);
        let above = resolve(Some(45), &[(&a, 60), (&b, 30)]).unwrap_err();
        let text = above.to_string();
        assert!(
            text.contains("maxHoldSeconds 45") && text.contains("30") && text.contains("ns/b"),
            "{text}"
        );
    }

    #[test]
    fn the_warning_is_a_tenth_of_the_hold_at_least_a_second_or_what_is_asked() {
        assert_eq!(warning(60, None).unwrap(), Duration::from_secs(6));
        assert_eq!(warning(5, None).unwrap(), Duration::from_secs(1));
        assert_eq!(warning(60, Some(20)).unwrap(), Duration::from_secs(20));
        for bad in [(60, Some(61)), (60, Some(0)), (0, Some(5))] {
            let text = warning(bad.0, bad.1).unwrap_err().to_string();
            assert!(text.contains(WARNING_FIELD), "{text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_counts_from_the_grant_and_warns_ahead_of_it() {
        let granted = clock::now() - Duration::from_secs(2);
        let d = Deadline::start(10, Duration::from_secs(3), granted).unwrap();
        let left = d.at - Instant::now();
        assert!(
            left <= Duration::from_secs(8) && left > Duration::from_millis(7900),
            "{left:?}"
        );
        assert_eq!(d.at - d.warn_at(), Duration::from_secs(3));
        assert_eq!(d.wall, granted + Duration::from_secs(10));
        assert!(Deadline::start(0, Duration::ZERO, granted).is_none());
    }
}
