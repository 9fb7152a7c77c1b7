//! etcd connection flags shared by every command that talks to etcd.

use clap::Args;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use std::path::PathBuf;
use std::time::Duration;

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

    async fn connect_to(&self, endpoints: &[String]) -> anyhow::Result<Client> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(3), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let (Some(user), Some(password)) = (&self.etcd_user, &self.etcd_password) {
            opts = opts.with_user(user, password);
        }
        if self.etcd_ca_file.is_some() || self.etcd_cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.etcd_ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(std::fs::read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.etcd_cert_file, &self.etcd_key_file) {
                tls = tls.identity(Identity::from_pem(std::fs::read(cert)?, std::fs::read(key)?));
            }
            opts = opts.with_tls(tls);
        }
        Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to etcd at {}: {e}", endpoints.join(",")))
    }
}
