//! Namespace isolation in etcd: with etcd auth, each namespace that uses podlock gets an etcd
//! role that can read its settings and read-write its queues only, and a user with that role
//! whose credentials live in the Secret `podlock-etcd` of the namespace. The webhook gives the
//! injected sidecar those credentials, so a pod cannot take or break another namespace's locks.
//!
//! The operator manages users and roles, so it must connect as etcd's `root` (or a user with
//! the root role). Without `--etcd-user` there is no isolation: it says so once, in the log.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use tracing::{info, warn};

use crate::lock::Store;

/// The Secret with a namespace's etcd credentials (`username`, `password`).
pub const SECRET: &str = "podlock-etcd";

/// Provisions etcd credentials per namespace, once per namespace and process.
pub struct Isolation {
    enabled: bool,
    done: Mutex<HashSet<String>>,
}

impl Isolation {
    /// Isolation on (the operator connects to etcd as a user) or off (warned about once).
    pub fn new(enabled: bool) -> Self {
        if !enabled {
            warn!(
                "etcd auth is not configured (no --etcd-user): pods of any namespace can take or break any \
                 lock; enable etcd auth and give the operator root credentials for namespace isolation"
            );
        }
        Isolation {
            enabled,
            done: Mutex::default(),
        }
    }

    /// Whether sidecars get per-namespace credentials.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Makes sure `namespace` has its role, user and Secret.
    pub async fn ensure(&self, client: &kube::Client, store: &Store, namespace: &str) -> anyhow::Result<()> {
        if !self.enabled || self.done.lock().unwrap().contains(namespace) {
            return Ok(());
        }
        let name = format!("podlock-ns-{namespace}");
        store.ensure_role(namespace, &name).await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let have_secret = secrets.get_opt(SECRET).await?.is_some();
        if !(have_secret && store.user_exists(&name).await) {
            let password = random_password()?;
            store.set_user(&name, &password, &name).await?;
            let data = BTreeMap::from([
                ("username".to_string(), ByteString(name.clone().into_bytes())),
                ("password".to_string(), ByteString(password.into_bytes())),
            ]);
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(SECRET.into()),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            let apply = PatchParams::apply("podlock-operator").force();
            secrets.patch(SECRET, &apply, &Patch::Apply(&secret)).await?;
            info!(
                namespace,
                user = name,
                "provisioned etcd credentials for the namespace"
            );
        }
        self.done.lock().unwrap().insert(namespace.to_string());
        Ok(())
    }
}

/// 32 hex characters from the operating system's random source.
fn random_password() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
