//! Namespace isolation in etcd: with etcd auth, each namespace that uses podlock gets an etcd
//! role that can read its settings and read-write its queues only, and a user with that role
//! whose credentials live in the Secret `podlock-etcd` of the namespace. The webhook gives the
//! injected sidecar those credentials, so a pod cannot take or break another namespace's locks.
//!
//! The operator manages users and roles, so it must connect as etcd's `root` (or a user with
//! the root role). Without `--etcd-user` there is no isolation: it says so once, in the log.
//!
//! The operator only ever *creates* these Secrets, and never reads, lists or patches a Secret
//! outside its own namespace: its RBAC can then grant `create` alone cluster-wide. Were it
//! allowed to read a Secret by name in every namespace as well, its token could create a
//! `kubernetes.io/service-account-token` Secret of that name for any ServiceAccount and read
//! the token back (an escalation to cluster-admin). So the password's record is in etcd (a key
//! no namespace's role can read) and "is the Secret there?" is a create that answers 409.
//!
//! When a namespace gets its credentials: when the first DistributedLock of the namespace is
//! reconciled, and when the webhook injects a pod there (before the API server stores the pod,
//! so its sidecar never starts without them). A deleted Secret is made again, with the same
//! password, by the leader's periodic check ([`Isolation::keep_secrets`]) and at the next
//! injection in that namespace.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tracing::{info, warn};

use crate::lock::Store;

/// The Secret with a namespace's etcd credentials (`username`, `password`, and with etcd TLS
/// the CA that signed etcd's certificate, `ca.crt`).
pub const SECRET: &str = "podlock-etcd";

/// Provisions etcd credentials per namespace.
pub struct Isolation {
    enabled: bool,
    /// etcd's CA (PEM), given to every namespace's sidecars with their credentials.
    ca: Option<Vec<u8>>,
    /// Namespaces provisioned by this process, with their etcd password.
    provisioned: Mutex<HashMap<String, String>>,
}

impl Isolation {
    /// Isolation on (the operator connects to etcd as a user) or off (warned about once);
    /// `ca`: etcd's CA, with etcd TLS.
    pub fn new(enabled: bool, ca: Option<Vec<u8>>) -> Self {
        if !enabled {
            warn!(
                "etcd auth is not configured (no --etcd-user): pods of any namespace can take or break any \
                 lock; enable etcd auth and give the operator root credentials for namespace isolation"
            );
        }
        Isolation {
            enabled,
            ca,
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

    /// Makes sure `namespace` has its role, user and Secret; after the first success in this
    /// process, does nothing (the reconciler calls it for every change of a lock).
    pub async fn ensure(&self, client: &kube::Client, store: &Store, namespace: &str) -> anyhow::Result<()> {
        if !self.enabled || self.password(namespace).is_some() {
            return Ok(());
        }
        let user = user(namespace);
        store.ensure_role(namespace, &user).await?;
        let password = store.namespace_password(namespace, &random_password()?).await?;
        store.set_user(&user, &password, &user).await?;
        let created = create_secret(client, namespace, &password, self.ca.as_deref()).await;
        if created.map_err(|e| cannot_create(namespace, e))? {
            info!(namespace, user, "provisioned etcd credentials for the namespace");
        }
        let mut provisioned = self.provisioned.lock().unwrap();
        provisioned.insert(namespace.to_string(), password);
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
            Some(password) => recreate(client, namespace, &password, self.ca.as_deref())
                .await
                .map_err(|e| cannot_create(namespace, e)),
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
                match recreate(client, &namespace, &password, self.ca.as_deref()).await {
                    Ok(()) => {}
                    // The namespace is gone: forget it (a new one of that name is provisioned
                    // afresh when it uses podlock).
                    Err(kube::Error::Api(e)) if e.code == 404 => {
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
}

/// The etcd user (and role) of `namespace`.
fn user(namespace: &str) -> String {
    format!("podlock-ns-{namespace}")
}

/// The error of a failed create of `namespace`'s Secret.
fn cannot_create(namespace: &str, e: kube::Error) -> anyhow::Error {
    anyhow::anyhow!("cannot create Secret {SECRET} in namespace {namespace}: {e}")
}

/// Creates the Secret if it is missing, saying so.
async fn recreate(
    client: &kube::Client,
    namespace: &str,
    password: &str,
    ca: Option<&[u8]>,
) -> kube::Result<()> {
    if create_secret(client, namespace, password, ca).await? {
        warn!(
            namespace,
            secret = SECRET,
            "the etcd credentials Secret was deleted: made it again"
        );
    }
    Ok(())
}

/// Creates `namespace`'s Secret; `false` when it exists already (409).
async fn create_secret(
    client: &kube::Client,
    namespace: &str,
    password: &str,
    ca: Option<&[u8]>,
) -> kube::Result<bool> {
    let mut data = BTreeMap::from([
        ("username".to_string(), ByteString(user(namespace).into_bytes())),
        ("password".to_string(), ByteString(password.as_bytes().to_vec())),
    ]);
    if let Some(ca) = ca {
        data.insert("ca.crt".to_string(), ByteString(ca.to_vec()));
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "podlock-operator".to_string(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// 32 hex characters from the operating system's random source.
fn random_password() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
