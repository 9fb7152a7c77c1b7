//! A namespace's credentials Secret: the object, and whether the one in the namespace must be
//! written again ([`rewrite`]), decided from what etcd recorded of it, since the operator may
//! not read it (see the parent module).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tracing::{info, warn};

use crate::lock::{LockError, Store};

#[cfg(test)]
mod tests;

/// The Secret with a namespace's etcd credentials (`username`, `password`, and with etcd TLS
/// the CA that signed etcd's certificate, `ca.crt`).
pub const SECRET: &str = "podlock-etcd";

/// Why a Secret could not be provisioned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The create of the Secret failed (not for being there already).
    #[error("cannot create Secret {SECRET} in namespace {namespace}: {source}")]
    Create {
        /// The Secret's namespace.
        namespace: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// Writing a stale Secret again failed.
    #[error("cannot write Secret {SECRET} in namespace {namespace} again ({cause}): {source}")]
    Replace {
        /// The Secret's namespace.
        namespace: String,
        /// Why it was written again.
        cause: Rewrite,
        /// The API server's answer.
        source: kube::Error,
    },
    /// etcd did not answer about the record of the Secret.
    #[error("cannot read or write the record of Secret {SECRET} of namespace {namespace} in etcd: {source}")]
    Record {
        /// The Secret's namespace.
        namespace: String,
        /// etcd's error.
        source: LockError,
    },
}

/// Whether `e` says the Secret's namespace no longer exists.
pub fn namespace_gone(e: &Error) -> bool {
    matches!(e, Error::Create { source: kube::Error::Api(e), .. } if e.code == 404)
}

/// What a namespace's Secret was last written with, as recorded in etcd beside its password:
/// the SHA-256 of etcd's CA (hex; empty without TLS) and its owner's uid (empty: none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    ca: String,
    owner: String,
}

/// Why a Secret that is there is written again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rewrite {
    /// etcd had no password for the namespace: its credentials are new, not the Secret's.
    #[error(
        "etcd had no password for the namespace (a new etcd, or its data was lost), so the Secret's is refused"
    )]
    NewPassword,
    /// etcd has no record of the Secret.
    #[error(
        "etcd has no record of what the Secret holds (an older operator wrote it, or the record was lost)"
    )]
    Unrecorded,
    /// The Secret carries another CA than the one that signed etcd's certificate.
    #[error("etcd's CA is not the one the Secret carries")]
    CaChanged,
    /// The Secret is not owned by this installation's ClusterRole.
    #[error("the Secret is not owned by this installation (helm uninstall would leave it)")]
    OwnerChanged,
}

/// Whether a Secret that is there must be written again, and why: `new_password`, etcd had
/// none for the namespace; `recorded`, etcd's record of what the Secret holds; `wanted`, what
/// it must hold.
pub fn rewrite(new_password: bool, recorded: Option<&str>, wanted: &Record) -> Option<Rewrite> {
    if new_password {
        return Some(Rewrite::NewPassword);
    }
    let Some(recorded) = recorded.and_then(|r| serde_json::from_str::<Record>(r).ok()) else {
        return Some(Rewrite::Unrecorded);
    };
    if recorded.ca != wanted.ca {
        Some(Rewrite::CaChanged)
    } else if recorded.owner != wanted.owner {
        Some(Rewrite::OwnerChanged)
    } else {
        None
    }
}

/// What a namespace's Secret holds.
pub struct Credentials<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// Its etcd user.
    pub user: String,
    /// The user's password.
    pub password: &'a str,
    /// etcd's CA, with TLS.
    pub ca: Option<&'a [u8]>,
    /// The Secret's owner.
    pub owner: Option<&'a OwnerReference>,
    /// The operator's cluster name (empty: unnamed), whose record of the Secret this is.
    pub cluster: &'a str,
}

impl Credentials<'_> {
    /// Makes sure the namespace's Secret holds these credentials: creates it, or writes it
    /// again if etcd's record does not vouch for the one there (`new_password`: etcd had no
    /// password for the namespace), then records what it holds.
    pub async fn provision(
        &self,
        client: &kube::Client,
        store: &Store,
        new_password: bool,
    ) -> Result<(), Error> {
        let record = |source| Error::Record {
            namespace: self.namespace.into(),
            source,
        };
        let recorded = (store.secret_record(self.namespace, self.cluster).await).map_err(record)?;
        let wanted = self.record();
        let stale = rewrite(new_password, recorded.as_deref(), &wanted);
        if self.create(client).await? {
            info!(
                namespace = self.namespace,
                user = self.user,
                "provisioned etcd credentials for the namespace"
            );
        } else if let Some(cause) = stale {
            self.replace(client, cause).await?;
            warn!(namespace = self.namespace, user = self.user, %cause, "the etcd credentials Secret was stale: wrote it again");
        }
        let wanted = serde_json::to_string(&wanted).expect("a record serializes");
        if recorded.as_deref() != Some(wanted.as_str()) {
            let recording = store.record_secret(self.namespace, self.cluster, &wanted);
            recording.await.map_err(record)?;
        }
        Ok(())
    }

    /// Creates the Secret if it is missing, saying so.
    pub async fn recreate(&self, client: &kube::Client) -> Result<(), Error> {
        if self.create(client).await? {
            warn!(
                namespace = self.namespace,
                secret = SECRET,
                "the etcd credentials Secret was deleted: made it again"
            );
        }
        Ok(())
    }

    /// What etcd records of this Secret.
    fn record(&self) -> Record {
        Record {
            ca: self.ca.map(sha256).unwrap_or_default(),
            owner: (self.owner.map(|o| o.uid.clone())).unwrap_or_default(),
        }
    }

    /// Creates the Secret; `false` when it exists already (409).
    async fn create(&self, client: &kube::Client) -> Result<bool, Error> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), self.namespace);
        match secrets.create(&PostParams::default(), &self.object()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(source) => Err(Error::Create {
                namespace: self.namespace.into(),
                source,
            }),
        }
    }

    /// Writes the Secret whole over the one there (an update without a resourceVersion: the
    /// operator never read it).
    async fn replace(&self, client: &kube::Client, cause: Rewrite) -> Result<(), Error> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), self.namespace);
        match secrets
            .replace(SECRET, &PostParams::default(), &self.object())
            .await
        {
            Ok(_) => Ok(()),
            Err(source) => Err(Error::Replace {
                namespace: self.namespace.into(),
                cause,
                source,
            }),
        }
    }

    /// The Secret.
    fn object(&self) -> Secret {
        let mut data = BTreeMap::from([
            ("username".to_string(), ByteString(self.user.clone().into_bytes())),
            (
                "password".to_string(),
                ByteString(self.password.as_bytes().to_vec()),
            ),
        ]);
        if let Some(ca) = self.ca {
            data.insert("ca.crt".to_string(), ByteString(ca.to_vec()));
        }
        let labels = BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            "podlock-operator".to_string(),
        )]);
        Secret {
            metadata: ObjectMeta {
                name: Some(SECRET.into()),
                labels: Some(labels),
                owner_references: self.owner.map(|o| vec![o.clone()]),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(data),
            ..Default::default()
        }
    }
}

/// SHA-256 of `bytes`, in hex.
fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}
