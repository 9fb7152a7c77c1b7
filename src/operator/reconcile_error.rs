//! Why a reconciliation failed, and the cause as a metric label.

use crate::lock::{LockError, LockId, Unavailable};

/// Why a reconciliation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// etcd failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The API server failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Provisioning the namespace's etcd credentials failed.
    #[error("etcd credentials for the namespace: {0}")]
    Isolation(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The object cannot carry the finalizer (no name, or a malformed finalizer).
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The lock's settings in etcd changed under every publish (another operator replica, or
    /// `podlock declare` on a lock that a DistributedLock declares).
    #[error(
        "the settings of lock {0} changed in etcd while the operator published them, again and \
         again: is `podlock declare` run on it, or a second operator with another leader election?"
    )]
    SettingsChanging(LockId),
}

impl Error {
    /// Every [`label`](Self::label), so that each `reconcile_total` series exists from the start.
    pub const LABELS: [&str; 11] = [
        "etcd_unavailable",
        "etcd_full",
        "etcd_rejected",
        "etcd_forbidden",
        "etcd_corrupt",
        "invalid_spec",
        "lock_unexpected",
        "etcd_credentials",
        "kube_api",
        "finalizer",
        "settings_changing",
    ];

    /// The cause as `podlock_reconcile_total`'s `result` label: what an operator of the cluster
    /// would look at first.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Lock(LockError::Unavailable(Unavailable::EtcdFull(_))) => "etcd_full",
            Error::Lock(LockError::Unavailable(_) | LockError::LeaseNotFound(_)) => "etcd_unavailable",
            Error::Lock(LockError::Rejected(_)) => "etcd_rejected",
            Error::Lock(LockError::Forbidden(_)) => "etcd_forbidden",
            Error::Lock(LockError::Corrupt(_)) => "etcd_corrupt",
            // The spec's settings, out of bounds (the CRD's schema admits only valid ones).
            Error::Lock(LockError::Invalid(_)) => "invalid_spec",
            // The lock engine's other answers are not expected from declaring or deleting.
            Error::Lock(_) => "lock_unexpected",
            Error::Isolation(_) => "etcd_credentials",
            Error::Kube(_) => "kube_api",
            Error::Finalizer(_) => "finalizer",
            Error::SettingsChanging(_) => "settings_changing",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_its_own_listed_snake_case_label() {
        let errors = [
            Error::Lock(Unavailable::Timeout(std::time::Duration::from_secs(5)).into()),
            Error::Lock(Unavailable::EtcdFull("database space exceeded".into()).into()),
            Error::Lock(LockError::Rejected("request is too large".into())),
            Error::Lock(LockError::Forbidden("wrong password".into())),
            Error::Lock(LockError::Corrupt("not JSON".into())),
            Error::Lock(LockError::Invalid("ttlSeconds out of bounds".into())),
            Error::Lock(LockError::NotFound(LockId::new("ns", "l").unwrap())),
            Error::Isolation("cannot add the user".into()),
            Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::Finalizer("unnamed object".into()),
            Error::SettingsChanging(LockId::new("ns", "l").unwrap()),
        ];
        let labels: Vec<_> = errors.iter().map(Error::label).collect();
        assert_eq!(labels, Error::LABELS);
        for label in labels {
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
    }
}
