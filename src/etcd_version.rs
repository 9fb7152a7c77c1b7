//! etcd's version, checked by the sidecar and the operator alike (issue #55): read at start,
//! off the hot path, and again every [`RECHECK`] so that an upgraded etcd clears the warning
//! without restarting every pod. Below podlock's documented minimum ([`MINIMUM`]) each says so
//! in a `warn!` line naming the version found, the minimum and every missing fix, and in
//! `podlock_etcd_below_minimum`; the operator adds a Warning Event (`operator/etcd_version.rs`).
//! A version that cannot be read is logged, never fatal.

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{info, warn};

use crate::lock::{Fix, MINIMUM, Said, Versions};
use crate::metrics::registered;

/// How often etcd's version is read again after the first time.
pub const RECHECK: Duration = Duration::from_secs(3600);

/// The version metrics, in the sidecar's and the operator's registry alike.
#[derive(Clone)]
pub struct VersionGauges {
    /// `podlock_etcd_version_info{version}`: 1 for each version etcd's members said at the
    /// last check (no series before one was read).
    pub info: IntGaugeVec,
    /// `podlock_etcd_below_minimum`: 1 while the oldest member read is below [`MINIMUM`].
    pub below_minimum: IntGauge,
}

impl VersionGauges {
    /// Registers both gauges in `registry`.
    pub fn registered(registry: &Registry) -> Self {
        let help = "1 for each version etcd's members said at the last check";
        let info = IntGaugeVec::new(Opts::new("podlock_etcd_version_info", help), &["version"]);
        let below_help = format!("1 while the oldest etcd member read is below podlock's minimum {MINIMUM}");
        let below = IntGauge::new("podlock_etcd_below_minimum", below_help);
        VersionGauges {
            info: registered(registry, info.unwrap()),
            below_minimum: registered(registry, below.unwrap()),
        }
    }

    /// Sets both gauges from `versions`; leaves them as they were when none was read.
    fn set(&self, versions: &Versions) {
        if versions.said.is_empty() {
            return;
        }
        self.info.reset();
        for said in &versions.said {
            self.info.with_label_values(&[&said.version]).set(1);
        }
        self.below_minimum.set((!versions.missing().is_empty()).into());
    }
}

/// Spawns a task that reads etcd's versions with `read` now and every [`RECHECK`]: it sets
/// `gauges`, and logs what was read whenever it changed (a member that could not be read, at
/// every check). Each time etcd is newly found below the minimum, the warning's text is sent
/// on the channel returned (which the sidecar, with nothing more to do, drops).
pub fn spawn_checks<F>(
    gauges: VersionGauges,
    read: impl Fn() -> F + Send + 'static,
) -> UnboundedReceiver<String>
where
    F: Future<Output = Versions> + Send,
{
    let (warnings, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut last: Vec<Said> = vec![];
        loop {
            let versions = read().await;
            gauges.set(&versions);
            for e in &versions.unread {
                warn!(error = %e, "could not read etcd's version; podlock cannot tell whether etcd has the fixes it relies on");
            }
            if !versions.said.is_empty() && versions.said != last {
                if let Some(warning) = judge(&versions) {
                    let _ = warnings.send(warning); // nobody listens in the sidecar
                }
                last = versions.said;
            }
            tokio::time::sleep(RECHECK).await;
        }
    });
    received
}

/// Logs the verdict on `versions` (some read); returns the warning when below the minimum.
fn judge(versions: &Versions) -> Option<String> {
    let oldest = versions.oldest()?;
    let missing = versions.missing();
    if missing.is_empty() {
        info!(version = %oldest.version, minimum = %MINIMUM, "etcd's version meets podlock's minimum");
        return None;
    }
    let warning = warning(&oldest.version, &missing);
    warn!(version = %oldest.version, minimum = %MINIMUM, "{warning}");
    Some(warning)
}

/// What the warning says: the version found, the minimum, each missing fix and its release.
pub fn warning(version: &str, missing: &[&Fix]) -> String {
    let fixes: Vec<String> = missing.iter().map(ToString::to_string).collect();
    format!(
        "etcd {version} is below podlock's documented minimum {MINIMUM} and lacks: {}. Upgrade \
         etcd to {MINIMUM} or later (docs/troubleshooting.md, EtcdBelowMinimum).",
        fixes.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::FIXES;
    use crate::metrics::render;

    /// `answers` as the members said them.
    fn versions(answers: &[&str]) -> Versions {
        Versions::of(answers.iter().map(|v| Ok(v.to_string())))
    }

    #[test]
    fn the_warning_names_the_version_the_minimum_and_every_missing_fix_within_an_events_limit() {
        let all: Vec<&Fix> = FIXES.iter().collect();
        let text = warning("3.5.17", &all);
        assert!(text.len() <= 1024, "{} bytes: {text}", text.len());
        for says in [
            "3.5.17",
            "3.6.14",
            "GHSA-xg4h-6gfc-h4m8",
            "LeaseCheckpoint",
            "3.6.11",
        ] {
            assert!(text.contains(says), "no {says}: {text}");
        }
        assert!(!warning("3.6.13", &versions(&["3.6.13"]).missing()).contains("3.6.11"));
    }

    #[test]
    fn the_gauges_follow_the_versions_read_and_keep_the_last_when_none_was() {
        let registry = Registry::new();
        let gauges = VersionGauges::registered(&registry);
        gauges.set(&versions(&["3.6.16", "3.5.17"]));
        let text = render(&registry);
        assert!(
            text.contains("podlock_etcd_version_info{version=\"3.5.17\"} 1"),
            "{text}"
        );
        assert!(text.contains("podlock_etcd_below_minimum 1"), "{text}");
        gauges.set(&versions(&["3.6.16"]));
        gauges.set(&Versions::default());
        let text = render(&registry);
        assert!(!text.contains("3.5.17"), "an old version stays: {text}");
        assert!(
            text.contains("podlock_etcd_version_info{version=\"3.6.16\"} 1"),
            "{text}"
        );
        assert!(text.contains("podlock_etcd_below_minimum 0"), "{text}");
    }

    #[test]
    fn only_a_version_below_the_minimum_is_judged_a_warning() {
        assert!(judge(&versions(&["3.6.14", "3.6.16"])).is_none());
        assert!(judge(&versions(&["3.6.16", "3.6.13"])).is_some_and(|w| w.contains("3.6.13")));
        assert!(
            judge(&versions(&["garbled"])).is_none(),
            "nothing read, nothing claimed"
        );
    }
}
