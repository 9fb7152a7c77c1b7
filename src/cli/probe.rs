//! `podlock probe`: the injected sidecar's startup and readiness probe. The kubelet runs it in
//! the sidecar's container, so it asks the API on loopback: no mesh's traffic capture, network
//! policy or IP family of the cluster stands between it and the sidecar.

use clap::Args;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Flags of `podlock probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// The address to ask, HOST:PORT: by default the sidecar's own `PODLOCK_LISTEN`, which
    /// the probe inherits (the chart's `helm test` asks the operator's Service instead).
    #[arg(long, env = "PODLOCK_LISTEN", default_value = "127.0.0.1:4040")]
    pub addr: String,
    /// What to ask: `/healthz` means the API serves (etcd's health is `/readyz`).
    #[arg(long, default_value = "/healthz")]
    pub path: String,
    /// Keep asking, once a second, for up to this many seconds (0: ask once), e.g. while a
    /// Service's endpoints or DNS catch up with pods that just became Ready.
    #[arg(long, default_value_t = 0)]
    pub within: u64,
    /// How many seconds one request may take: longer than the answer takes to make (the
    /// operator's `/checkz` waits up to 3 s for etcd before it answers 503 naming the cause).
    #[arg(long, default_value_t = 1)]
    pub timeout: u64,
}

/// Succeeds when the address answers 2xx (within a second), asking again for up to `--within`
/// seconds; otherwise says what it got last.
pub async fn run(args: ProbeArgs) -> anyhow::Result<()> {
    let url = format!("http://{}{}", loopback(&args.addr), args.path);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.within);
    loop {
        let asked = ask(&url, Duration::from_secs(args.timeout)).await;
        if asked.is_ok() || tokio::time::Instant::now() >= deadline {
            return asked;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One request to `url`: Ok on a 2xx answer within `timeout`; the error keeps its causes (a
/// timeout, a refused connection, DNS), which the process prints.
async fn ask(url: &str, timeout: Duration) -> anyhow::Result<()> {
    let response = reqwest::Client::new()
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| anyhow::Error::new(e).context(url.to_string()))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    anyhow::bail!("{url} answered {status}: {body}")
}

/// `addr`, with a wildcard address (a listener's) replaced by loopback of the same family.
fn loopback(addr: &str) -> String {
    let Ok(socket) = addr.parse::<SocketAddr>() else {
        return addr.to_string();
    };
    let ip = match socket.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, socket.port()).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_listener_wildcard_is_asked_on_loopback() {
        assert_eq!(super::loopback("0.0.0.0:4040"), "127.0.0.1:4040");
        assert_eq!(super::loopback("[::]:4041"), "[::1]:4041");
        assert_eq!(super::loopback("127.0.0.1:5050"), "127.0.0.1:5050");
        assert_eq!(
            super::loopback("podlock-metrics.podlock.svc:8080"),
            "podlock-metrics.podlock.svc:8080"
        );
    }
}
