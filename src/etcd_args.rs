//! etcd connection flags shared by every command that talks to etcd.

use crate::etcd_transport;
use clap::Args;
use etcd_client::{Certificate, Channel, Client, ConnectOptions, Identity, TlsOptions};
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::Endpoint;

/// How to reach etcd.
#[derive(Debug, Clone, Args)]
pub struct EtcdArgs {
    /// etcd endpoints, comma-separated URLs.
    #[arg(
        long,
        env = "PODLOCK_ETCD_ENDPOINTS",
        default_value = "http://127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub etcd_endpoints: Vec<String>,
    /// etcd user name (etcd auth).
    #[arg(long, env = "PODLOCK_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// etcd password (etcd auth).
    #[arg(long, env = "PODLOCK_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// A directory holding the etcd user name and password as files `username` and `password`
    /// (a mounted Secret of type kubernetes.io/basic-auth), instead of --etcd-user and
    /// --etcd-password: the password stays out of the process's environment.
    #[arg(long, env = "PODLOCK_ETCD_CREDENTIALS_DIR", conflicts_with_all = ["etcd_user", "etcd_password"])]
    pub etcd_credentials_dir: Option<PathBuf>,
    /// CA certificate (PEM) to verify etcd's serving certificate.
    #[arg(long, env = "PODLOCK_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for etcd mutual TLS.
    #[arg(long, env = "PODLOCK_ETCD_CERT_FILE", requires = "etcd_key_file")]
    pub etcd_cert_file: Option<PathBuf>,
    /// Client key (PEM) for etcd mutual TLS.
    #[arg(long, env = "PODLOCK_ETCD_KEY_FILE", requires = "etcd_cert_file")]
    pub etcd_key_file: Option<PathBuf>,
}

impl EtcdArgs {
    /// Connects to etcd. Requests time out after 5 s, so an outage surfaces as an error, never
    /// a hang; HTTP/2 pings notice a dead connection within a few seconds.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        self.connect_to(&self.etcd_endpoints).await
    }

    /// One client per endpoint (none for a single endpoint), for what must go to a member of
    /// its own choosing: a keepalive retried on the next member after one stalled, and new
    /// watches and requests kept off a member found stalled.
    pub async fn connect_each(&self) -> anyhow::Result<Vec<Client>> {
        if self.etcd_endpoints.len() < 2 {
            return Ok(vec![]);
        }
        let mut clients = vec![];
        for endpoint in &self.etcd_endpoints {
            clients.push(self.connect_to(std::slice::from_ref(endpoint)).await?);
        }
        Ok(clients)
    }

    /// The clients of [`connect`](Self::connect) and [`connect_each`](Self::connect_each),
    /// reading the credentials and the CA file anew.
    pub async fn connect_all(&self) -> anyhow::Result<(Client, Vec<Client>)> {
        Ok((self.connect().await?, self.connect_each().await?))
    }

    /// Whether podlock talks to etcd as a user (etcd auth): from the flags or a credentials
    /// directory. Namespace isolation hangs on this, not on `--etcd-user` alone.
    pub fn has_credentials(&self) -> bool {
        self.etcd_user.is_some() || self.etcd_credentials_dir.is_some()
    }

    /// The etcd user name and password, from the flags or the credentials directory; `None`
    /// without etcd auth.
    pub fn credentials(&self) -> anyhow::Result<Option<(String, String)>> {
        let Some(dir) = &self.etcd_credentials_dir else {
            return Ok(self.etcd_user.clone().zip(self.etcd_password.clone()));
        };
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
                .map_err(|e| anyhow::anyhow!("--etcd-credentials-dir: cannot read {}: {e}", path.display()))
        };
        Ok(Some((read("username")?, read("password")?)))
    }

    async fn connect_to(&self, endpoints: &[String]) -> anyhow::Result<Client> {
        let tls = self.tls()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(PING_EVERY, PING_TIMEOUT)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some((user, password)) = self.credentials()? {
            // etcd's auth tokens are kept by the member that issued them (simple tokens) and
            // expire: when that member restarts (a rolling upgrade of the bundled etcd) every
            // request with the old token is refused as "invalid auth token". Authenticate again
            // and retry, as etcd's Go client does, instead of failing every lock call with 403.
            opts = opts.with_user(user, password).with_auto_token_refresh(true);
        }
        let connected = match (endpoints, tls) {
            ([one], tls) => {
                let channel = etcd_transport::channel(&endpoint(one, tls)?);
                Client::from_channel(Channel::Tonic(channel), Some(opts)).await
            }
            (_, Some(tls)) => Client::connect(endpoints, Some(opts.with_tls(tls))).await,
            (_, None) => Client::connect(endpoints, Some(opts)).await,
        };
        connected.map_err(|e| anyhow::anyhow!("cannot connect to etcd at {}: {e}", endpoints.join(",")))
    }

    /// The TLS settings the flags ask for, if any.
    fn tls(&self) -> anyhow::Result<Option<TlsOptions>> {
        if self.etcd_ca_file.is_none() && self.etcd_cert_file.is_none() {
            return Ok(None);
        }
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.etcd_ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(std::fs::read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.etcd_cert_file, &self.etcd_key_file) {
            tls = tls.identity(Identity::from_pem(std::fs::read(cert)?, std::fs::read(key)?));
        }
        Ok(Some(tls))
    }
}

/// Connecting to a member gives up after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A request unanswered for this long fails, so an outage surfaces as an error, never a hang.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings every `PING_EVERY`, unanswered for `PING_TIMEOUT`, end a dead connection.
const PING_EVERY: Duration = Duration::from_secs(3);
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The gRPC endpoint of one member, with the settings `etcd_client` gives the endpoints it
/// makes itself (it makes none for a channel it is given). A URL without a scheme is https
/// when TLS is configured, as `etcd_client` reads it.
fn endpoint(url: &str, tls: Option<TlsOptions>) -> anyhow::Result<Endpoint> {
    let url = match (url.contains("://"), tls.is_some()) {
        (true, _) => url.to_string(),
        (false, true) => format!("https://{url}"),
        (false, false) => format!("http://{url}"),
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| anyhow::anyhow!("etcd endpoint {url} is not a URL: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .http2_keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_TIMEOUT)
        .keep_alive_while_idle(true);
    match tls {
        Some(tls) if url.starts_with("https://") => endpoint = endpoint.tls_config(tls)?,
        Some(_) => anyhow::bail!("etcd endpoint {url}: TLS flags need an https:// URL"),
        None => {}
    }
    Ok(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        etcd: EtcdArgs,
    }

    #[test]
    fn credentials_come_from_the_flags_or_the_mounted_secret() {
        let flags = Cli::parse_from(["x", "--etcd-user", "u", "--etcd-password", "p"]).etcd;
        assert_eq!(flags.credentials().unwrap(), Some(("u".into(), "p".into())));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("username"), "root").unwrap();
        std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
        let path = dir.path().to_str().unwrap();
        let mounted = Cli::parse_from(["x", "--etcd-credentials-dir", path]).etcd;
        assert!(mounted.has_credentials() && flags.has_credentials());
        assert!(!Cli::parse_from(["x"]).etcd.has_credentials());
        assert_eq!(
            mounted.credentials().unwrap(),
            Some(("root".into(), "s3cret".into()))
        );
        std::fs::remove_file(dir.path().join("password")).unwrap();
        let missing = mounted.credentials().unwrap_err().to_string();
        assert!(missing.contains("password"), "{missing}");
        let both = Cli::try_parse_from(["x", "--etcd-credentials-dir", path, "--etcd-password", "p"]);
        assert!(both.is_err(), "a password given twice was taken");
    }
}
