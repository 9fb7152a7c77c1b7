//! The etcd auth side of [`Store`]: each namespace's role, user and password, the record of
//! the credentials Secret the operator wrote for it, and turning auth on.

use etcd_client::{Compare, CompareOp, Permission, Txn, TxnOp, TxnOpResponse};

use super::Store;
use crate::lock::error::LockError;
use crate::lock::protocol::keys;

/// A namespace's etcd password, as [`Store::namespace_password`] found or recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespacePassword {
    /// The password.
    pub password: String,
    /// Whether etcd had none for the namespace, so that this call recorded it: a Secret with
    /// the namespace's credentials made before (for another etcd) does not have it.
    pub new: bool,
}

impl Store {
    /// Makes sure role `role` exists and may read `namespace`'s settings and read and write
    /// its queues, and nothing else. Grants only what is missing: every grant moves etcd's auth
    /// revision on, which outdates the token of every client (each must authenticate again).
    pub async fn ensure_role(&self, namespace: &str, role: &str) -> Result<(), LockError> {
        let mut c = self.0.client();
        let granted = match c.role_get(role).await {
            Ok(got) => got.permissions(),
            Err(_) => match c.role_add(role).await {
                Ok(_) => vec![],
                // Added a moment ago by another caller (a replica, the webhook): read it.
                Err(e) if e.to_string().contains("already exists") => c.role_get(role).await?.permissions(),
                Err(e) => return Err(e.into()),
            },
        };
        let read = Permission::read(keys::config_prefix(Some(namespace))).with_prefix();
        let write = Permission::read_write(keys::queue_root(Some(namespace))).with_prefix();
        for wanted in [read, write] {
            if !granted.contains(&wanted) {
                c.role_grant_permission(role, wanted).await?;
            }
        }
        Ok(())
    }

    /// The etcd password of `namespace`'s user: the one recorded in etcd, else `candidate`,
    /// recorded now (then [`NamespacePassword::new`]). One transaction, so concurrent callers
    /// (replicas, the webhook and the reconciler) all get the same password. Kept under a key
    /// no namespace role can read, so that a deleted Secret can be recreated with the password
    /// running pods already use.
    pub async fn namespace_password(
        &self,
        namespace: &str,
        candidate: &str,
    ) -> Result<NamespacePassword, LockError> {
        let key = keys::credentials_key(namespace);
        let absent = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
        let txn = Txn::new()
            .when([absent])
            .and_then([TxnOp::put(key.as_str(), candidate, None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = self.0.txn(txn).await?;
        let recorded = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(got)) => got.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        };
        let Some(value) = recorded else {
            return Ok(NamespacePassword {
                password: candidate.to_string(),
                new: true,
            });
        };
        let password = String::from_utf8(value).map_err(|_| {
            LockError::Corrupt(format!(
                "the etcd password recorded at {key} is not UTF-8; delete that key to make a new one"
            ))
        })?;
        Ok(NamespacePassword { password, new: false })
    }

    /// Creates user `user` with `password`, or gives it that password, and grants it `role`.
    /// Changes nothing etcd already has (a restarted operator provisions again): every change
    /// moves etcd's auth revision on and outdates the token of every client.
    pub async fn set_user(&self, user: &str, password: &str, role: &str) -> Result<(), LockError> {
        let mut c = self.0.client();
        let roles = match c.user_get(user).await {
            Ok(got) => {
                let (name, given) = (user.to_string(), password.to_string());
                if c.auth_client().authenticate(name, given).await.is_err() {
                    c.user_change_password(user, password).await?;
                }
                got.roles().to_vec()
            }
            Err(_) => match c.user_add(user, password, None).await {
                Ok(_) => vec![],
                // Added a moment ago by another caller, with the same password (the one
                // recorded in etcd: [`Store::namespace_password`]): read it.
                Err(e) if e.to_string().contains("already exists") => {
                    c.user_get(user).await?.roles().to_vec()
                }
                Err(e) => return Err(e.into()),
            },
        };
        if !roles.iter().any(|r| r == role) {
            c.user_grant_role(user, role).await?;
        }
        Ok(())
    }

    /// Adds user `root` with `password` (or sets its password), gives it the root role and
    /// turns etcd auth on. Only possible while auth is off; every step may be repeated.
    pub async fn enable_auth(&self, password: &str) -> Result<(), LockError> {
        let mut c = self.0.client();
        match c.user_get("root").await {
            Ok(user) => {
                c.user_change_password("root", password).await?;
                if !user.roles().iter().any(|r| r == "root") {
                    c.user_grant_role("root", "root").await?;
                }
            }
            Err(_) => {
                c.user_add("root", password, None).await?;
                c.user_grant_role("root", "root").await?;
            }
        }
        c.auth_enable().await?;
        Ok(())
    }

    /// What the operator of `cluster` recorded of the credentials Secret it last wrote for
    /// `namespace` ([`Store::record_secret`]), if anything.
    pub async fn secret_record(&self, namespace: &str, cluster: &str) -> Result<Option<String>, LockError> {
        let resp = self
            .0
            .get(keys::secret_record_key(namespace, cluster), None)
            .await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        Ok(Some(String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// Records `record`, what the operator of `cluster` wrote into `namespace`'s credentials
    /// Secret (under a key no namespace role can read, beside its password).
    pub async fn record_secret(&self, namespace: &str, cluster: &str, record: &str) -> Result<(), LockError> {
        let put = TxnOp::put(keys::secret_record_key(namespace, cluster), record, None);
        self.0.txn(Txn::new().and_then([put])).await?;
        Ok(())
    }
}
