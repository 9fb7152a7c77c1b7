//! Turning etcd auth on, for an etcd the operator is responsible for (the chart's bundled
//! one): a fresh etcd starts with auth off, and the operator, which holds the root password
//! anyway, adds the `root` user and enables auth before it connects as root. Idempotent and
//! safe with several replicas starting at once: with auth already on it does nothing, and a
//! replica that loses the race finds root working.

use tracing::info;

use crate::etcd_args::EtcdArgs;
use crate::lock::Store;
use crate::retry::{self, Pauses};

/// Makes sure etcd has auth on with `root` and the password in `etcd`, and returns a store
/// connected as root.
pub async fn enable(etcd: &EtcdArgs) -> anyhow::Result<Store> {
    let password = match etcd.credentials()? {
        Some((user, password)) if user == "root" => password,
        _ => anyhow::bail!(
            "--etcd-enable-auth needs user root and its password (--etcd-user and --etcd-password, \
             or --etcd-credentials-dir)"
        ),
    };
    let root = || async { etcd.connect().await.map(Store::new) };
    let refused = match root().await {
        Ok(root) => return Ok(root),
        Err(e) => e,
    };
    let anonymous = EtcdArgs {
        etcd_user: None,
        etcd_password: None,
        etcd_credentials_dir: None,
        ..etcd.clone()
    };
    let (mut last, mut pauses) = (None, Pauses::new(retry::etcd()));
    for _ in 0..ATTEMPTS {
        // Each step is repeatable, so a replica that raced another (both adding root) or one
        // that stopped halfway simply goes through them again.
        match anonymous.connect().await {
            Ok(c) => match Store::new(c).enable_auth(&password).await {
                Ok(()) => {
                    info!("etcd auth was off: added user root and turned auth on");
                    return root().await;
                }
                Err(e) => last = Some(e.to_string()),
            },
            Err(e) => last = Some(format!("{e:#}")),
        }
        // Another replica may have just turned auth on: then root works now.
        if let Ok(root) = root().await {
            return Ok(root);
        }
        tokio::time::sleep(pauses.next_pause()).await;
    }
    anyhow::bail!(
        "etcd refused root ({refused:#}) and auth could not be turned on ({}): if etcd auth is \
         already on, its root password is not the one given (was the Secret with it re-made?)",
        last.unwrap_or_default()
    )
}

/// How often turning auth on is tried (the pauses between tries are etcd requests' own).
const ATTEMPTS: usize = 5;
