//! The token epoch a lock is published under. Fencing tokens are etcd create revisions under
//! an epoch ([`Token`]). An etcd wiped, rebuilt or restored from an older snapshot starts its
//! revisions low again; the operator then publishes the lock under a new epoch, so that its
//! tokens keep rising. It knows which epochs and tokens were handed out from what etcd's loss
//! cannot take back ([`Known`], the DistributedLock's status): the epoch recorded before one is
//! published, and the largest token seen. The operator chooses by [`choose`], and so does the
//! protocol model, which checks the rule against etcd wiped and restored under the locks.

use std::fmt;

use super::token::{Token, TokenError, next_epoch};
use crate::lock::bugs::{self, Bug};

/// What was handed out of a lock before, as kept outside etcd (`status.fencingEpoch` and
/// `status.fencingToken`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Known {
    /// The highest epoch the lock was published under (recorded before it is published).
    pub published: Option<u32>,
    /// The largest fencing token seen.
    pub token: Option<Token>,
}

/// Why a lock moves to a new epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// etcd does not have the settings of a lock published before, under `epoch`.
    Lost {
        /// The highest epoch published before.
        epoch: u32,
    },
    /// etcd's revision lies below the revision part of the largest token seen, under the same
    /// epoch: the revisions went backwards.
    WentBack {
        /// etcd's revision now.
        revision: i64,
        /// `status.fencingToken`.
        token: Token,
    },
    /// etcd brought back queue keys the operator's watch had seen end (see `returned`): a
    /// restore with `--bump-revision`, whose revisions go on.
    Returned,
    /// etcd's settings carry an epoch below one published before.
    OlderEpoch {
        /// The epoch in etcd.
        found: u32,
        /// The highest epoch published before.
        published: u32,
    },
}

impl fmt::Display for Renewal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Renewal::Lost { epoch } => write!(
                f,
                "etcd does not have the lock's settings, published before under epoch {epoch} \
                 (etcd wiped, rebuilt, or restored from a snapshot taken before the lock existed)"
            ),
            Renewal::WentBack { revision, token } => write!(
                f,
                "etcd's revision went backwards: it is {revision}, below {}, the revision of \
                 status.fencingToken {token} (etcd restored from an older snapshot without \
                 --bump-revision)",
                token.revision()
            ),
            Renewal::Returned => write!(
                f,
                "etcd brought back queue keys of holds or waits that had ended (etcd restored \
                 from an older snapshot with --bump-revision)"
            ),
            Renewal::OlderEpoch { found, published } => write!(
                f,
                "etcd has the lock's settings under epoch {found}, below epoch {published} it was \
                 published under (etcd restored from a snapshot taken before that)"
            ),
        }
    }
}

/// The epoch to publish a lock under, and why it is a new one, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The epoch.
    pub epoch: u32,
    /// Why it is not the one etcd has, if it is not.
    pub renewal: Option<Renewal>,
}

/// The epoch for a lock of which `known` was handed out, whose settings in etcd carry epoch
/// `found` (`None`: etcd does not have them), etcd being at revision `revision`, `returned` if
/// etcd brought back keys of the lock that had ended. A new epoch lies above every one
/// published before, every token seen and etcd's own; etcd's own is kept while nothing says
/// that etcd went back.
pub fn choose(
    Known { published, token }: Known,
    found: Option<u32>,
    (revision, returned): (i64, bool),
) -> Result<Choice, TokenError> {
    let known = published.into_iter().chain(token.map(Token::epoch)).max();
    let renewal = match (found, known) {
        (None, None) => None,
        (None, Some(epoch)) => Some(Renewal::Lost { epoch }),
        (Some(found), Some(published)) if found < published => Some(Renewal::OlderEpoch { found, published }),
        (Some(found), _) => match token {
            Some(token) if token.exceeds(found, revision) => Some(Renewal::WentBack { revision, token }),
            _ if returned && !bugs::on(Bug::ReturnedUndetected) => Some(Renewal::Returned),
            _ => None,
        },
    };
    let epoch = match renewal {
        Some(_) => next_epoch(known.max(found).unwrap_or(0))?,
        None => found.unwrap_or(0),
    };
    Ok(Choice { epoch, renewal })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(epoch: Option<u32>, token: Option<(u32, i64)>) -> Known {
        Known {
            published: epoch,
            token: token.map(|(e, r)| Token::new(e, r).unwrap()),
        }
    }

    fn choose_for(s: &Known, found: Option<u32>, revision: i64) -> Choice {
        choose(*s, found, (revision, false)).unwrap()
    }

    #[test]
    fn a_new_lock_starts_at_epoch_0_and_a_live_one_keeps_its_epoch() {
        assert_eq!(
            choose(Known::default(), None, (5, false)).unwrap(),
            Choice {
                epoch: 0,
                renewal: None
            }
        );
        let live = status(Some(2), Some((2, 90)));
        let kept = Choice {
            epoch: 2,
            renewal: None,
        };
        assert_eq!(
            choose_for(&live, Some(2), 90),
            kept,
            "the last grant is etcd's last write"
        );
        assert_eq!(choose_for(&live, Some(2), 500), kept);
        assert_eq!(
            choose_for(&live, Some(3), 1),
            Choice { epoch: 3, ..kept },
            "raised by hand"
        );
        // Status written by an operator before epochs: a token, no epoch.
        let old = status(None, Some((0, 11)));
        assert_eq!(
            choose_for(&old, Some(0), 40),
            Choice {
                epoch: 0,
                renewal: None
            }
        );
    }

    #[test]
    fn settings_gone_from_etcd_move_on_past_every_published_epoch() {
        // Tokens up to 11, then etcd wiped: the token's epoch was 0.
        let wiped = choose_for(&status(None, Some((0, 11))), None, 1);
        assert_eq!(wiped.epoch, 1);
        assert_eq!(wiped.renewal, Some(Renewal::Lost { epoch: 0 }));
        // Published under epoch 4 (recorded first), no token of it seen yet: still above 4.
        let ahead = choose_for(&status(Some(4), Some((3, 70))), None, 1);
        assert_eq!(ahead.epoch, 5);
        // Published, never granted, then lost: a new epoch all the same (a grant may not have
        // reached the status).
        assert_eq!(choose_for(&status(Some(0), None), None, 1).epoch, 1);
    }

    #[test]
    fn a_revision_below_the_largest_token_or_an_older_epoch_is_a_restore() {
        let seen = status(Some(1), Some((1, 500)));
        let restored = choose_for(&seen, Some(1), 120);
        assert_eq!(restored.epoch, 2);
        let token = Token::new(1, 500).unwrap();
        assert_eq!(restored.renewal, Some(Renewal::WentBack { revision: 120, token }));
        let message = restored.renewal.unwrap().to_string();
        assert!(message.starts_with("etcd's revision went backwards"), "{message}");
        let older = choose_for(&seen, Some(0), 900);
        assert_eq!(older.epoch, 2);
        assert_eq!(
            older.renewal,
            Some(Renewal::OlderEpoch {
                found: 0,
                published: 1
            })
        );
    }

    #[test]
    fn epochs_run_out_with_an_error_not_a_wrapped_token() {
        let last = status(Some(crate::lock::protocol::token::MAX_EPOCH), None);
        assert!(choose(last, None, (1, false)).is_err());
    }

    #[test]
    fn keys_brought_back_move_a_lock_on_even_with_revisions_above_every_token() {
        let seen = status(Some(0), Some((0, 500)));
        let back = choose(seen, Some(0), (1_000_600, true)).unwrap();
        assert_eq!((back.epoch, back.renewal), (1, Some(Renewal::Returned)));
        let fresh = choose(Known::default(), Some(2), (40, true)).unwrap();
        assert_eq!(fresh.epoch, 3, "no status: above etcd's own epoch");
        assert_eq!(choose_for(&seen, Some(0), 1_000_600).renewal, None);
    }
}
