//! The `reason` label of `podlock_locks_lost_total`: why a hold ended by anything but its
//! release, as a bounded set of values that alerts can tell apart. The engine says why in a
//! sentence (the `reason` of the `lost` event); this names its kind, with the names the
//! operator's `podlock_forced_releases_total{reason}` gives the same ends. A hold of a
//! multi-lock set lost because another lock of its set was is counted under that lock's reason.

use crate::lock::{DEADLINE, YIELD};

/// Every value of the label, each with the start of the engine's sentences it names.
const REASONS: [(&str, &str); 7] = [
    ("lease_expired", "its lease expired or was revoked"),
    ("key_deleted", "its key was deleted"),
    ("admin_release", "an administrator released it"),
    (DEADLINE, DEADLINE),
    (YIELD, YIELD),
    ("heartbeat", "no heartbeat within"),
    ("shutdown", "the sidecar stopped"),
];

/// What no sentence above starts: a reason the engine gained and this file does not know yet.
pub const OTHER: &str = "other";

/// The ends that someone meant (a maximum hold time reached, a yield asked, an administrator's
/// release): the alert on lost holds does not count them.
pub const INTENDED: [&str; 3] = [DEADLINE, YIELD, "admin_release"];

/// Why another lock's loss ended a hold of its set: `SET_LOST (LOCK: REASON)`.
const SET_LOST: &str = "another lock of its set was lost (";

/// The label for the engine's `reason`.
pub fn label(reason: &str) -> &'static str {
    if let Some(rest) = reason.strip_prefix(SET_LOST) {
        let cause = rest.split_once(": ").map_or("", |(_, cause)| cause);
        return label(cause.strip_suffix(')').unwrap_or(cause));
    }
    let known = REASONS.iter().find(|(_, start)| reason.starts_with(start));
    known.map_or(OTHER, |(label, _)| label)
}

/// The labels alerts count, each reported from a lock's first acquire on (0 until a hold is
/// lost so), so that an alert sees a series rather than nothing at the first loss.
pub fn alerting() -> impl Iterator<Item = &'static str> {
    let labels = REASONS.iter().map(|(label, _)| *label).chain([OTHER]);
    labels.filter(|l| !INTENDED.contains(l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sentence_gets_its_label_and_a_set_its_cause() {
        for (reason, wanted) in [
            ("its lease expired or was revoked", "lease_expired"),
            (
                "its key was deleted (lock deleted or hold revoked)",
                "key_deleted",
            ),
            (
                "an administrator released it (podlock.io/release on its DistributedLock)",
                "admin_release",
            ),
            ("deadline", "deadline"),
            ("yield", "yield"),
            ("no heartbeat within heartbeatTimeoutSeconds", "heartbeat"),
            (
                "the sidecar stopped (its pod is terminating); the lease was revoked",
                "shutdown",
            ),
            ("another lock of its set was lost (a: yield)", "yield"),
            (
                "another lock of its set was lost (a: its lease expired or was revoked)",
                "lease_expired",
            ),
            ("something new", "other"),
        ] {
            assert_eq!(label(reason), wanted, "{reason}");
        }
        let alerting: Vec<_> = alerting().collect();
        assert_eq!(
            alerting,
            ["lease_expired", "key_deleted", "heartbeat", "shutdown", "other"]
        );
    }
}
