//! etcd's server version against the minimum podlock documents (docs/operations.md, "etcd"):
//! which fixes podlock relies on, the release that brought each, and which of them a cluster
//! lacks. Every member the client knows is asked (a request may land on any of them, so the
//! cluster is as old as its oldest member); the comparison itself is pure.

use etcd_client::Client;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::link::Link;

/// The release podlock documents as its minimum: the one with the last fix of [`FIXES`].
pub const MINIMUM: Release = Release::new(3, 6, 14);

/// How long one member has to say its version.
const WITHIN: Duration = Duration::from_secs(5);

/// An etcd release, `major.minor.patch`; a pre-release (`3.6.0-rc.1`) comes before its release,
/// whose fixes it may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    major: u32,
    minor: u32,
    patch: u32,
    /// Not a pre-release (`false` sorts first: a pre-release is older).
    released: bool,
}

impl Release {
    /// Release `major.minor.patch`, not a pre-release.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Release {
            major,
            minor,
            patch,
            released: true,
        }
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.released {
            f.write_str("-pre")?;
        }
        Ok(())
    }
}

/// Why etcd's version could not be known.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// The member did not answer the status request, or refused it.
    #[error("{member} did not say its version: {source}")]
    Unanswered {
        /// Which member: its place in `--etcd-endpoints`, or "etcd" with a single endpoint.
        member: String,
        /// What the client said.
        #[source]
        source: etcd_client::Error,
    },
    /// The member did not answer within [`WITHIN`].
    #[error("{member} did not say its version within {WITHIN:?}")]
    Silent {
        /// Which member, as in [`VersionError::Unanswered`].
        member: String,
    },
    /// The version said is not `major.minor.patch` (optionally `-pre-release`).
    #[error("etcd's version {0:?} is not major.minor.patch")]
    Unparseable(String),
}

impl FromStr for Release {
    type Err = VersionError;

    fn from_str(said: &str) -> Result<Self, VersionError> {
        let unparseable = || VersionError::Unparseable(said.to_string());
        let trimmed = said.trim().trim_start_matches('v');
        let (numbers, pre) = match trimmed.split_once('-') {
            Some((_, "")) => return Err(unparseable()),
            Some((numbers, _)) => (numbers, true),
            None => (trimmed, false),
        };
        let parts: Vec<u32> = (numbers.split('.'))
            .map(|n| n.parse().map_err(|_| unparseable()))
            .collect::<Result<_, _>>()?;
        match parts[..] {
            [major, minor, patch] => Ok(Release {
                released: !pre,
                ..Release::new(major, minor, patch)
            }),
            _ => Err(unparseable()),
        }
    }
}

/// A fix podlock relies on, and the first release that has it.
#[derive(Debug, PartialEq, Eq)]
pub struct Fix {
    /// The first release with the fix.
    pub since: Release,
    /// What it fixes (or brings), short enough that all of them fit in a Kubernetes Event.
    pub what: &'static str,
}

/// The fixes and features of etcd podlock relies on (from etcd's changelogs), oldest first.
pub const FIXES: [Fix; 5] = [
    Fix {
        since: Release::new(3, 6, 0),
        what: "lease checkpoint feature gates (--feature-gates=LeaseCheckpoint=true,\
               LeaseCheckpointPersist=true) and 3.6's progress and watch fixes",
    },
    Fix {
        since: Release::new(3, 6, 2),
        what: "a watch from a future revision could return old events",
    },
    Fix {
        since: Release::new(3, 6, 5),
        what: "a lease renewal could report success on a revoked lease",
    },
    Fix {
        since: Release::new(3, 6, 11),
        what: "RBAC bypass through prev_kv or lease attachment in nested transactions",
    },
    Fix {
        since: Release::new(3, 6, 14),
        what: "watch permission leak GHSA-xg4h-6gfc-h4m8 (a reader of one key saw events of \
               keys after it; namespace isolation rests on etcd roles)",
    },
];

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (fixed in {})", self.what, self.since)
    }
}

/// The fixes a server of `release` lacks, oldest first.
pub fn missing(release: Release) -> Vec<&'static Fix> {
    FIXES.iter().filter(|fix| release < fix.since).collect()
}

/// What one member said its version was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    /// As etcd wrote it (`3.6.16`).
    pub version: String,
    /// Parsed.
    pub release: Release,
}

/// etcd's versions, as its members said them.
#[derive(Debug, Default)]
pub struct Versions {
    /// Each version read, one per member that answered.
    pub said: Vec<Said>,
    /// Why a member's version could not be read.
    pub unread: Vec<VersionError>,
}

impl Versions {
    /// Sorts each member's answer into `said` or `unread`.
    pub fn of(answers: impl IntoIterator<Item = Result<String, VersionError>>) -> Self {
        let mut versions = Versions::default();
        for answer in answers {
            match answer.and_then(|version| Ok((version.parse()?, version))) {
                Ok((release, version)) => versions.said.push(Said { version, release }),
                Err(e) => versions.unread.push(e),
            }
        }
        versions
    }

    /// The oldest member's version, if any was read.
    pub fn oldest(&self) -> Option<&Said> {
        self.said.iter().min_by_key(|s| s.release)
    }

    /// The fixes the oldest member lacks (none when no version was read).
    pub fn missing(&self) -> Vec<&'static Fix> {
        self.oldest().map_or_else(Vec::new, |s| missing(s.release))
    }
}

impl Link {
    /// Asks every member the current clients know (with a single endpoint, the one answering)
    /// for its version, at once.
    pub async fn etcd_versions(&self) -> Versions {
        let clients = self.current();
        let members = clients.members.each();
        let asked: Vec<(String, Client)> = match members.len() {
            0 => vec![("etcd".to_string(), clients.client.clone())],
            n => (members.iter().enumerate())
                .map(|(i, c)| (format!("etcd endpoint {} of {n}", i + 1), c.clone()))
                .collect(),
        };
        let answers = asked.into_iter().map(|(member, c)| version_of(member, c));
        Versions::of(futures::future::join_all(answers).await)
    }
}

/// The version `member`, reached by `client`, says it runs.
async fn version_of(member: String, mut client: Client) -> Result<String, VersionError> {
    match tokio::time::timeout(WITHIN, client.status()).await {
        Ok(Ok(status)) => Ok(status.version().to_string()),
        Ok(Err(source)) => Err(VersionError::Unanswered { member, source }),
        Err(_) => Err(VersionError::Silent { member }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(said: &str) -> Release {
        said.parse().unwrap_or_else(|e| panic!("{said}: {e}"))
    }

    #[test]
    fn versions_parse_and_order_numerically_with_pre_releases_first() {
        assert_eq!(release("3.6.16"), Release::new(3, 6, 16));
        assert_eq!(release("v3.5.17"), Release::new(3, 5, 17));
        assert!(release("3.6.9") < release("3.6.14"), "not as text");
        assert!(release("3.6.14-rc.0") < MINIMUM);
        assert!(release("3.6.13") < release("3.6.14-rc.0"));
        assert_eq!(release("3.6.14-rc.0").to_string(), "3.6.14-pre");
    }

    #[test]
    fn what_is_not_a_version_is_an_error_not_a_guess() {
        for said in [
            "", "3.6", "3.6.x", "3.6.14.1", "3..14", "3.6.14-", "-1.2.3", "etcd",
        ] {
            let parsed = said.parse::<Release>();
            assert!(
                matches!(&parsed, Err(VersionError::Unparseable(s)) if s == said),
                "{said:?}: {parsed:?}"
            );
        }
    }

    #[test]
    fn a_release_lacks_exactly_the_fixes_of_later_releases() {
        let since = |r: &str| {
            missing(release(r))
                .iter()
                .map(|f| f.since.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(since("3.5.17").len(), FIXES.len());
        assert_eq!(since("3.6.4"), ["3.6.5", "3.6.11", "3.6.14"]);
        assert_eq!(since("3.6.5"), ["3.6.11", "3.6.14"]);
        assert_eq!(since("3.6.13"), ["3.6.14"]);
        assert_eq!(since("3.6.14-rc.0"), ["3.6.14"]);
        assert!(since("3.6.14").is_empty());
        assert!(since("3.7.0").is_empty());
    }

    #[test]
    fn the_minimum_is_the_release_of_the_last_fix() {
        let last = FIXES.iter().map(|f| f.since).max();
        assert_eq!(last, Some(MINIMUM));
        assert!(FIXES.windows(2).all(|w| w[0].since < w[1].since), "oldest first");
    }

    #[test]
    fn a_cluster_is_as_old_as_its_oldest_member_and_unreadable_answers_are_kept_apart() {
        let answers = ["3.6.16", "3.6.4", "garbled"].map(|v| Ok(v.to_string()));
        let silent = Err(VersionError::Silent { member: "m3".into() });
        let versions = Versions::of(answers.into_iter().chain([silent]));
        assert_eq!(versions.said.len(), 2);
        assert_eq!(versions.oldest().unwrap().version, "3.6.4");
        assert_eq!(versions.missing().len(), 3);
        assert_eq!(versions.unread.len(), 2);
        assert!(
            Versions::of([]).missing().is_empty(),
            "nothing read, nothing claimed"
        );
    }
}
