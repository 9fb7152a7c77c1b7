//! Namespace isolation in etcd: with etcd auth, each namespace that uses podlock gets an etcd
//! role that can read its settings and read-write its queues only, and a user with that role
//! whose credentials live in the Secret `podlock-etcd` of the namespace. The webhook gives the
//! injected sidecar those credentials, so a pod cannot take or break another namespace's locks.
//!
//! The operator manages users and roles, so it must connect as etcd's `root` (or a user with
//! the root role). Without `--etcd-user` there is no isolation: it says so once, in the log.
//!
//! The operator never reads, lists or patches a Secret outside its own namespace: its RBAC
//! grants `create` cluster-wide, and `update` of Secrets named `podlock-etcd` only. Were it
//! allowed to read a Secret by name in every namespace as well, its token could create a
//! `kubernetes.io/service-account-token` Secret of that name for any ServiceAccount and read
//! the token back (an escalation to cluster-admin); an update answers with what it sent. So
//! what a namespace's Secret holds is recorded in etcd (keys no namespace's role can read): the
//! password, and what the Secret was last written with (`secret::Record`: etcd's CA, the
//! owner). "Is the Secret there?" is a create that answers 409; a Secret that is there but
//! that the record does not vouch for (etcd is new, so the password is; etcd's CA changed; an
//! older operator wrote it) is written again, whole, with the cause in the log.
//!
//! The Secrets are owned by the operator's ClusterRole (`owner.rs`): `helm uninstall`
//! deletes the ClusterRole, and Kubernetes' garbage collector the Secrets with it. One written
//! by an operator without that owner is written again with it (adopted).
//!
//! When a namespace gets its credentials: when the first DistributedLock of the namespace is
//! reconciled, and when the webhook injects a pod there (before the API server stores the pod,
//! so its sidecar never starts without them). A deleted Secret is made again, with the same
//! password, by the leader's periodic check ([`Isolation::keep_secrets`]) and at the next
//! injection in that namespace.

mod secret;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tracing::warn;

use crate::lock::Store;
use secret::Credentials;
pub use secret::SECRET;

/// Provisions etcd credentials per namespace.
pub struct Isolation {
    enabled: bool,
    /// etcd's CA (PEM), given to every namespace's sidecars with their credentials.
    ca: Option<Vec<u8>>,
    /// The owner of every namespace's Secret (the operator's ClusterRole), if any.
    owner: Option<OwnerReference>,
    /// The operator's cluster name (empty: unnamed): each cluster has its own Secrets.
    cluster: String,
    /// Namespaces provisioned by this process, with their etcd password.
    provisioned: Mutex<HashMap<String, String>>,
}

impl Isolation {
    /// Isolation on (the operator connects to etcd as a user) or off (warned about once);
    /// `ca`: etcd's CA, with etcd TLS; `owner`: what owns the Secrets; `cluster`: the
    /// operator's cluster name.
    pub fn new(enabled: bool, ca: Option<Vec<u8>>, owner: Option<OwnerReference>, cluster: &str) -> Self {
        if !enabled {
            warn!(
                "etcd auth is not configured (no --etcd-user): pods of any namespace can take or break any \
                 lock; enable etcd auth and give the operator root credentials for namespace isolation"
            );
        }
        Isolation {
            enabled,
            ca,
            owner,
            cluster: cluster.into(),
            provisioned: Mutex::default(),
        }
    }

    /// Whether sidecars get per-namespace credentials.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether the credentials Secrets carry etcd's CA (`ca.crt`).
    pub fn has_ca(&self) -> bool {
        self.enabled && self.ca.is_some()
    }

    /// Makes sure `namespace` has its role, user and a Secret with their current credentials;
    /// after the first success in this process, does nothing (the reconciler calls it for
    /// every change of a lock).
    pub async fn ensure(&self, client: &kube::Client, store: &Store, namespace: &str) -> anyhow::Result<()> {
        if !self.enabled || self.password(namespace).is_some() {
            return Ok(());
        }
        let user = user(namespace);
        store.ensure_role(namespace, &user).await?;
        let password = store.namespace_password(namespace, &random_password()?).await?;
        store.set_user(&user, &password.password, &user).await?;
        let credentials = self.credentials(namespace, &password.password);
        credentials.provision(client, store, password.new).await?;
        let mut provisioned = self.provisioned.lock().unwrap();
        provisioned.insert(namespace.to_string(), password.password);
        Ok(())
    }

    /// Like [`Isolation::ensure`], and makes the Secret again if it was deleted since: for
    /// the webhook, just before a pod that needs it is created.
    pub async fn ensure_secret(
        &self,
        client: &kube::Client,
        store: &Store,
        namespace: &str,
    ) -> anyhow::Result<()> {
        match self.password(namespace) {
            Some(password) => Ok(self.credentials(namespace, &password).recreate(client).await?),
            None => self.ensure(client, store, namespace).await,
        }
    }

    /// Every `period`, makes the Secret of every namespace provisioned by this process again
    /// if it was deleted. One create per namespace and period (the operator may not read
    /// Secrets; see the module's documentation).
    pub async fn keep_secrets(&self, client: &kube::Client, period: Duration) {
        if !self.enabled {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(period).await;
            let known: Vec<(String, String)> = self.provisioned.lock().unwrap().clone().into_iter().collect();
            for (namespace, password) in known {
                match self.credentials(&namespace, &password).recreate(client).await {
                    Ok(()) => {}
                    // The namespace is gone: forget it (a new one of that name is provisioned
                    // afresh when it uses podlock).
                    Err(e) if secret::namespace_gone(&e) => {
                        self.provisioned.lock().unwrap().remove(&namespace);
                    }
                    Err(e) => {
                        warn!(namespace, error = %e, "could not check the namespace's etcd credentials Secret")
                    }
                }
            }
        }
    }

    fn password(&self, namespace: &str) -> Option<String> {
        self.provisioned.lock().unwrap().get(namespace).cloned()
    }

    /// What `namespace`'s Secret holds, with `password`.
    fn credentials<'a>(&'a self, namespace: &'a str, password: &'a str) -> Credentials<'a> {
        Credentials {
            namespace,
            user: user(namespace),
            password,
            ca: self.ca.as_deref(),
            owner: self.owner.as_ref(),
            cluster: &self.cluster,
        }
    }
}

/// The etcd user (and role) of `namespace`.
fn user(namespace: &str) -> String {
    format!("podlock-ns-{namespace}")
}

/// 32 hex characters from the operating system's random source.
fn random_password() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
