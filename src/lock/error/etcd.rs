//! What an etcd error means to podlock: the one place gRPC codes are read, and so the one
//! place an etcd error becomes a [`LockError`].

use super::{LockError, Unavailable};
use crate::lock::refusal::Refusal;

/// What an etcd error means to podlock: the one place gRPC codes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EtcdFailure {
    /// These credentials may not do this (or are wrong): final.
    Refused,
    /// The lease the request used is gone: the session is over.
    LeaseGone,
    /// It may go away by itself (a member or connection down, no leader, a leader change):
    /// worth sending again.
    Transient,
    /// The request's auth token was checked at an older auth revision than etcd's: a user,
    /// role or permission changed meanwhile (another namespace provisioned), or the member that
    /// took the request lags behind. Worth sending again with a new token, as etcd's Go client
    /// does (etcd-client renews only a token etcd no longer knows).
    AuthOutdated,
    /// etcd no longer has the history at the revision asked for (compacted past it, as a
    /// restore with `--mark-compacted` leaves it): final for that revision.
    Compacted,
    /// etcd is out of space: final until an administrator frees some.
    Full,
    /// Anything else (a bad request): final.
    Final,
}

impl EtcdFailure {
    /// Whether the same request may succeed if sent again.
    pub(crate) fn worth_resending(self) -> bool {
        matches!(self, EtcdFailure::Transient | EtcdFailure::AuthOutdated)
    }

    /// Classifies `e`.
    pub(crate) fn of(e: &etcd_client::Error) -> Self {
        use tonic::Code;
        match e {
            etcd_client::Error::GRpcStatus(s) => match s.code() {
                Code::PermissionDenied | Code::Unauthenticated => EtcdFailure::Refused,
                // A password refused as the token was renewed, a user or role etcd does not
                // know: credentials wrong or rotated, which are 403s as much as a denial is.
                Code::InvalidArgument | Code::FailedPrecondition if Refusal::of(e).is_some() => {
                    EtcdFailure::Refused
                }
                Code::InvalidArgument if s.message().contains("revision of auth store is old") => {
                    EtcdFailure::AuthOutdated
                }
                Code::NotFound if s.message().contains("lease not found") => EtcdFailure::LeaseGone,
                // etcd says both "database space exceeded" (NOSPACE) and "too many requests"
                // (its apply queue is behind) with this code; only the second passes by itself.
                Code::ResourceExhausted if s.message().contains("space exceeded") => EtcdFailure::Full,
                Code::ResourceExhausted => EtcdFailure::Transient,
                Code::OutOfRange if s.message().contains("compacted") => EtcdFailure::Compacted,
                // An answer in plain HTTP, not etcd's: a member still starting after a restart
                // answered 404 before serving gRPC (tonic maps it to Unimplemented), and a
                // `podlock declare` of the safety run failed on it. Sent again, it reaches etcd.
                Code::Unimplemented if s.message().contains("grpc-status header missing") => {
                    EtcdFailure::Transient
                }
                // The connection broke under the request (an etcd member restarting closes it:
                // HTTP/2 GOAWAY or a reset stream), which tonic reports as Internal. A helm
                // upgrade that rolled the bundled etcd answered acquires 400 with it.
                Code::Internal if s.message().starts_with("h2 protocol error") => EtcdFailure::Transient,
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted => EtcdFailure::Transient,
                _ => EtcdFailure::Final,
            },
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => EtcdFailure::Transient,
            _ => EtcdFailure::Final,
        }
    }
}

impl From<etcd_client::Error> for LockError {
    fn from(e: etcd_client::Error) -> Self {
        let message = |e: &etcd_client::Error| match e {
            etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
            other => other.to_string(),
        };
        match EtcdFailure::of(&e) {
            EtcdFailure::Refused => LockError::Forbidden(message(&e)),
            EtcdFailure::LeaseGone => LockError::LeaseNotFound(message(&e)),
            EtcdFailure::Transient | EtcdFailure::AuthOutdated => Unavailable::Unreachable(e).into(),
            EtcdFailure::Full => Unavailable::EtcdFull(message(&e)).into(),
            EtcdFailure::Compacted | EtcdFailure::Final => LockError::Rejected(message(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn from(code: Code, message: &str) -> LockError {
        etcd_client::Error::GRpcStatus(Status::new(code, message)).into()
    }

    #[test]
    fn each_etcd_failure_names_its_cause() {
        let cases = [
            (Code::InvalidArgument, "etcdserver: request is too large"),
            (
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (Code::ResourceExhausted, "etcdserver: too many requests"),
            (Code::Unavailable, "etcdserver: no leader"),
            (Code::PermissionDenied, "etcdserver: permission denied"),
            (
                Code::Unimplemented,
                "grpc-status header missing, mapped from HTTP status code 404",
            ),
            (Code::Internal, "h2 protocol error: http2 error"),
            (Code::InvalidArgument, "etcdserver: revision of auth store is old"),
        ];
        let [too_large, full, busy, no_leader, denied, starting, cut, outdated] =
            cases.map(|(c, m)| from(c, m));
        for transient in [&cut, &outdated] {
            assert!(
                matches!(transient, LockError::Unavailable(Unavailable::Unreachable(_))),
                "{transient:?}"
            );
        }
        assert!(
            matches!(too_large, LockError::Rejected(ref m) if m.contains("too large")),
            "{too_large:?}"
        );
        assert!(
            matches!(full, LockError::Unavailable(Unavailable::EtcdFull(_))),
            "{full:?}"
        );
        assert!(
            matches!(busy, LockError::Unavailable(Unavailable::Unreachable(_))),
            "{busy:?}"
        );
        assert!(
            matches!(no_leader, LockError::Unavailable(Unavailable::Unreachable(_))),
            "{no_leader:?}"
        );
        assert!(matches!(denied, LockError::Forbidden(_)), "{denied:?}");
        let password = "etcdserver: authentication failed, invalid user ID or password";
        let refused = from(Code::InvalidArgument, password);
        assert!(matches!(refused, LockError::Forbidden(_)), "{refused:?}");
        assert!(
            matches!(starting, LockError::Unavailable(Unavailable::Unreachable(_))),
            "{starting:?}"
        );
        assert!(full.to_string().contains("NOSPACE"), "{full}");
    }

    #[test]
    fn a_read_below_the_compacted_revision_is_told_from_one_of_a_future_revision() {
        let status = |m: &str| etcd_client::Error::GRpcStatus(Status::new(Code::OutOfRange, m));
        let compacted = status("etcdserver: mvcc: required revision has been compacted");
        let future = status("etcdserver: mvcc: required revision is a future revision");
        assert_eq!(EtcdFailure::of(&compacted), EtcdFailure::Compacted);
        assert_eq!(EtcdFailure::of(&future), EtcdFailure::Final);
    }
}
