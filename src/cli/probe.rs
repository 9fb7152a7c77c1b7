//! `podlock probe`: the injected sidecar's startup and readiness probe. The kubelet runs it in
//! the sidecar's container, so it asks the API on loopback: no mesh's traffic capture, network
//! policy or IP family of the cluster stands between it and the sidecar.

use clap::Args;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Flags of `podlock probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// The sidecar's API address (its own `PODLOCK_LISTEN`, which the probe inherits).
    #[arg(long, env = "PODLOCK_LISTEN", default_value = "127.0.0.1:4040")]
    pub addr: SocketAddr,
    /// What to ask: `/healthz` means the API serves (etcd's health is `/readyz`).
    #[arg(long, default_value = "/healthz")]
    pub path: String,
}

/// Succeeds when the sidecar answers 2xx within a second; otherwise says what it got.
pub async fn run(args: ProbeArgs) -> anyhow::Result<()> {
    let url = format!("http://{}{}", loopback(args.addr), args.path);
    let response = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    anyhow::bail!("{url} answered {status}: {body}")
}

/// `addr`, with a wildcard address replaced by loopback of the same family.
fn loopback(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}
