//! Turning etcd auth on, for an etcd the operator is responsible for (the chart's bundled
//! one): a fresh etcd starts with auth off, and the operator, which holds the root password
//! anyway, adds the `root` user and enables auth before it connects as root. Idempotent and
//! safe with several replicas starting at once: with auth already on it does nothing, and a
//! replica that loses the race finds root working.

use etcd_client::Client;
use tracing::info;

use crate::etcd_args::EtcdArgs;

/// Makes sure etcd has auth on with `root` and the password in `etcd`, and returns a client
/// connected as root.
pub async fn enable(etcd: &EtcdArgs) -> anyhow::Result<Client> {
    let (Some("root"), Some(password)) = (etcd.etcd_user.as_deref(), etcd.etcd_password.as_deref()) else {
        anyhow::bail!("--etcd-enable-auth needs --etcd-user root and --etcd-password");
    };
    let refused = match etcd.connect().await {
        Ok(root) => return Ok(root),
        Err(e) => e,
    };
    let anonymous = EtcdArgs {
        etcd_user: None,
        etcd_password: None,
        ..etcd.clone()
    };
    let mut c = anonymous.connect().await?;
    if let Err(e) = add_root(&mut c, password).await {
        // Another replica may have just turned auth on: then root works now.
        return etcd.connect().await.map_err(|_| {
            anyhow::anyhow!(
                "etcd refused root ({refused:#}) and auth could not be turned on ({e}): if etcd auth is \
                 already on, its root password is not the one given (was the Secret with it re-made?)"
            )
        });
    }
    info!("etcd auth was off: added user root and turned auth on");
    etcd.connect().await
}

/// Adds `root` with `password` (or sets its password), gives it the root role and turns auth
/// on. Only possible while auth is off.
async fn add_root(c: &mut Client, password: &str) -> Result<(), etcd_client::Error> {
    if c.user_get("root").await.is_ok() {
        c.user_change_password("root", password).await?;
    } else {
        c.user_add("root", password, None).await?;
    }
    c.user_grant_role("root", "root").await?;
    c.auth_enable().await?;
    Ok(())
}
