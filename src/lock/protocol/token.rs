//! Fencing tokens: the one place their arithmetic lives.
//!
//! A token is `epoch * 2^40 + revision`: the lock's epoch when its holder's key was enqueued,
//! then that key's etcd create revision. Within one etcd, revisions rise, so tokens do. An etcd
//! wiped, rebuilt or restored from an older snapshot starts its revisions low again; the
//! operator (or `podlock declare --min-token`) then publishes the lock under a higher epoch, and
//! its tokens continue above every earlier one. A lock's first etcd has epoch 0: its tokens are
//! the bare revisions. The queue's order uses the raw revisions; only what is handed out or
//! shown as a token goes through [`Token`].

use std::fmt;

/// The bits of a token that carry the create revision; the epoch lies above them.
pub const REVISION_BITS: u32 = 40;

/// The first revision a token cannot carry: 2^40.
pub const REVISION_LIMIT: i64 = 1 << REVISION_BITS;

/// The largest epoch: 2^23 - 1, so that every token is a positive 64-bit integer.
pub const MAX_EPOCH: u32 = (1 << (63 - REVISION_BITS)) - 1;

/// A fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(i64);

/// Why a token cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// etcd's revisions have outgrown the 40 bits a token gives them.
    #[error(
        "etcd's revision {0} is at or above 2^40 ({REVISION_LIMIT}), the largest a fencing \
         token can carry; move the locks to a new etcd (docs/operations.md, \"Backup and \
         restore\"): the operator, or `podlock declare --min-token`, continues their tokens \
         there under a higher epoch"
    )]
    Revision(i64),
    /// Every epoch is used up.
    #[error("epoch {0} is above the largest a fencing token can carry ({MAX_EPOCH})")]
    Epoch(u64),
}

impl Token {
    /// The token of a key created at `revision` under `epoch`.
    pub fn new(epoch: u32, revision: i64) -> Result<Token, TokenError> {
        if epoch > MAX_EPOCH {
            return Err(TokenError::Epoch(epoch.into()));
        }
        if !(0..REVISION_LIMIT).contains(&revision) {
            return Err(TokenError::Revision(revision));
        }
        Ok(Token((i64::from(epoch) << REVISION_BITS) | revision))
    }

    /// A token as handed out (a status' `fencingToken`, a `--min-token` flag). A negative
    /// number is no token: it counts as none, below every token.
    pub fn from_raw(raw: i64) -> Token {
        Token(raw.max(0))
    }

    /// Whether this token lies above every token that etcd, at `revision` and publishing
    /// under `epoch`, has handed out (then the tokens it hands out next may lie below it).
    pub fn exceeds(self, epoch: u32, revision: i64) -> bool {
        (epoch, revision) < (self.epoch(), self.revision())
    }

    /// Its epoch.
    pub fn epoch(self) -> u32 {
        (self.0 >> REVISION_BITS) as u32
    }

    /// Its revision part.
    pub fn revision(self) -> i64 {
        self.0 & (REVISION_LIMIT - 1)
    }

    /// The number handed out.
    pub fn get(self) -> i64 {
        self.0
    }
}

/// The epoch after `epoch`: every token under it lies above every token under `epoch`.
pub fn next_epoch(epoch: u32) -> Result<u32, TokenError> {
    let next = u64::from(epoch) + 1;
    match u32::try_from(next) {
        Ok(next) if next <= MAX_EPOCH => Ok(next),
        _ => Err(TokenError::Epoch(next)),
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_0_tokens_are_the_bare_revisions() {
        assert_eq!(Token::new(0, 11).unwrap().get(), 11);
        assert_eq!(
            Token::new(0, REVISION_LIMIT - 1).unwrap().get(),
            REVISION_LIMIT - 1
        );
    }

    #[test]
    fn a_later_epoch_lies_above_every_revision_of_an_earlier_one() {
        let last_of_0 = Token::new(0, REVISION_LIMIT - 1).unwrap();
        let first_of_1 = Token::new(1, 1).unwrap();
        assert!(first_of_1 > last_of_0);
        assert_eq!(first_of_1.get(), (1 << 40) + 1);
        assert_eq!((first_of_1.epoch(), first_of_1.revision()), (1, 1));
        let top = Token::new(MAX_EPOCH, REVISION_LIMIT - 1).unwrap();
        assert_eq!(top.get(), i64::MAX, "the largest token is the largest i64");
        assert_eq!(Token::from_raw(top.get()), top);
    }

    #[test]
    fn what_cannot_be_encoded_is_refused_never_wrapped() {
        assert_eq!(
            Token::new(0, REVISION_LIMIT),
            Err(TokenError::Revision(REVISION_LIMIT))
        );
        assert_eq!(
            Token::new(MAX_EPOCH + 1, 1),
            Err(TokenError::Epoch((MAX_EPOCH + 1).into()))
        );
        assert_eq!(
            next_epoch(MAX_EPOCH),
            Err(TokenError::Epoch((MAX_EPOCH + 1).into()))
        );
        let message = TokenError::Revision(REVISION_LIMIT).to_string();
        assert!(
            message.contains("2^40") && message.contains("new etcd"),
            "{message}"
        );
    }

    #[test]
    fn the_next_epoch_is_above_the_token() {
        let token = Token::new(3, 77).unwrap();
        assert_eq!(next_epoch(token.epoch()), Ok(4));
        assert!(Token::new(4, 1).unwrap() > token);
        assert!(token.exceeds(3, 76) && token.exceeds(2, 900));
        assert!(!token.exceeds(3, 77), "etcd's last write may be that very grant");
        assert!(!token.exceeds(4, 1));
        assert_eq!(Token::from_raw(-1), Token::new(0, 0).unwrap());
    }
}
