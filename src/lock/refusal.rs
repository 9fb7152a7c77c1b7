//! Refusals of the client itself rather than of one request: etcd no longer takes the
//! credentials or the CA this process connected with (a reinstall on fresh etcd volumes brings
//! new passwords and a new CA; a password rotated; a user or role removed). Where
//! [`EtcdFailure`](super::error::EtcdFailure) says what a failure means to the request, this
//! says whether a client built anew, from the credentials and CA on disk, may get in where this
//! one does not (see [`Link`](super::etcd::link::Link)).

use tonic::Code;

/// Why etcd refused this process's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The password is not the user's.
    #[error("etcd refused the password (authentication failed)")]
    Password,
    /// etcd has no such user (a new etcd, or the user was removed).
    #[error("etcd has no such user")]
    UnknownUser,
    /// etcd does not know the request's auth token, and no new one was had.
    #[error("etcd refused the auth token")]
    Token,
    /// The user may not do this any more: its role or permission is gone.
    #[error("etcd denied permission (the user's role may be gone)")]
    Permission,
    /// etcd's certificate is not signed by the CA this process trusts (a new CA).
    #[error("etcd's certificate did not verify against the CA file")]
    Certificate,
}

impl Refusal {
    /// What `e` says about the client, if it refuses it.
    pub fn of(e: &etcd_client::Error) -> Option<Self> {
        let status = match e {
            etcd_client::Error::GRpcStatus(status) => status,
            etcd_client::Error::TransportError(e) => return certificate(e),
            etcd_client::Error::IoError(e) => return certificate(e),
            _ => return None,
        };
        let says = |what: &str| status.message().contains(what);
        match status.code() {
            Code::InvalidArgument if says("authentication failed") => Some(Refusal::Password),
            Code::FailedPrecondition if says("user name not found") => Some(Refusal::UnknownUser),
            Code::FailedPrecondition if says("role name not found") => Some(Refusal::Permission),
            Code::Unauthenticated => Some(Refusal::Token),
            Code::PermissionDenied => Some(Refusal::Permission),
            // A connection that could not be made is reported as a status, its cause within.
            _ => certificate(status),
        }
    }
}

/// `Some(Certificate)` when a TLS handshake in `e`'s chain of causes refused etcd's certificate.
fn certificate(e: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut next = Some(e);
    while let Some(e) = next {
        // An I/O error shows the TLS error it carries through `get_ref` only, not `source`.
        let carried = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        let tls = carried
            .and_then(|c| c.downcast_ref::<rustls::Error>())
            .or_else(|| e.downcast_ref::<rustls::Error>());
        if matches!(tls, Some(rustls::Error::InvalidCertificate(_))) {
            return Some(Refusal::Certificate);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tonic::Status;

    fn of(code: Code, message: &str) -> Option<Refusal> {
        Refusal::of(&etcd_client::Error::GRpcStatus(Status::new(code, message)))
    }

    #[test]
    fn etcds_refusals_of_the_credentials_are_told_apart_from_other_failures() {
        let failed = "etcdserver: authentication failed, invalid user ID or password";
        assert_eq!(of(Code::InvalidArgument, failed), Some(Refusal::Password));
        let no_user = "etcdserver: user name not found";
        assert_eq!(of(Code::FailedPrecondition, no_user), Some(Refusal::UnknownUser));
        let token = "etcdserver: invalid auth token";
        assert_eq!(of(Code::Unauthenticated, token), Some(Refusal::Token));
        let denied = "etcdserver: permission denied";
        assert_eq!(of(Code::PermissionDenied, denied), Some(Refusal::Permission));
        let old = "etcdserver: revision of auth store is old";
        assert_eq!(of(Code::InvalidArgument, old), None);
        assert_eq!(of(Code::Unavailable, "etcdserver: no leader"), None);
    }

    #[test]
    fn a_certificate_refused_in_the_handshake_is_found_among_the_causes() {
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let handshake = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        assert_eq!(connect_failed(handshake), Some(Refusal::Certificate));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(connect_failed(refused), None);
    }

    /// What a request says when its connection could not be made for `cause`.
    fn connect_failed(cause: std::io::Error) -> Option<Refusal> {
        let mut status = Status::unavailable("tcp connect error");
        status.set_source(Arc::new(cause));
        Refusal::of(&etcd_client::Error::GRpcStatus(status))
    }
}
