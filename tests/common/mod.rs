//! Test harness: a real etcd on free loopback ports with a temporary data dir, and sidecar
//! processes of the real `podlock` binary. Shared by the integration tests and the benchmark.
#![allow(dead_code)] // each test binary uses a different part

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod events;
pub mod held;
pub mod kube;
pub mod lag;
pub mod members;
pub mod netns;
pub mod node;
mod rebuild;
pub mod results;
mod sidecar;
pub mod store;

pub use rebuild::Rebuild;
pub use sidecar::Sidecar;

/// What every etcd of the tests runs with beside its addresses: lease checkpoints on and kept
/// (as the chart's bundled etcd), so a leader change does not give a long lease its whole TTL
/// again (docs/operations.md, "etcd").
pub const ETCD_FEATURE_GATES: &str = "--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true";

/// Where `scripts/setup.sh` puts etcd and the Kubernetes binaries.
pub fn bin_dir() -> PathBuf {
    let cache = std::env::var("PODLOCK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/podlock"));
    let dir = cache.join("bin");
    assert!(
        dir.join("etcd").exists(),
        "no etcd in {}: run scripts/setup.sh first",
        dir.display()
    );
    dir
}

/// Spawns `cmd` so that it is killed when the spawning thread ends (a test that panics or a
/// test binary that exits leaves no process behind).
pub fn spawn_dying_with_parent(cmd: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()))
}

/// The podlock binary under test.
pub fn podlock_bin() -> &'static str {
    env!("CARGO_BIN_EXE_podlock")
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range (32768 and up): a port from `bind(0)` comes from that
    // range, where every outgoing connection takes its local port, and one did take such a port
    // between this call and etcd's bind ("address already in use"). Below Kubernetes' NodePort
    // range (30000 to 32767) too, which kube-proxy serves on the node test's addresses. The
    // counter keeps this process's tests apart; its start, taken from the pid, keeps processes
    // apart.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = 10_000 + std::process::id() % 1_000 * 20;
    loop {
        let port = 10_000 + (start - 10_000 + NEXT.fetch_add(1, Ordering::Relaxed)) % 20_000;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
}

fn log_file(dir: &std::path::Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(name)).unwrap()
}

/// An etcd reached at a client URL.
pub struct EtcdAt {
    /// The client URL.
    pub endpoint: String,
}

impl EtcdAt {
    /// An etcd client.
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([&self.endpoint], None)
            .await
            .unwrap()
    }

    /// Number of keys under `prefix`.
    pub async fn count(&self, prefix: &str) -> i64 {
        let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
        self.client().await.get(prefix, Some(opts)).await.unwrap().count()
    }

    /// Its current revision.
    pub async fn revision(&self) -> i64 {
        let opts = etcd_client::GetOptions::new().with_count_only();
        let resp = self.client().await.get("/", Some(opts)).await.unwrap();
        resp.header().expect("a response header").revision()
    }
}

/// A single-member etcd server; killed on drop.
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    name: String,
    peer_url: String,
    initial_cluster: String,
    /// The network namespace it runs in (see [`netns::MemberNet`]); `None`: this machine's.
    netns: Option<String>,
    at: EtcdAt,
}

impl std::ops::Deref for EtcdServer {
    type Target = EtcdAt;
    fn deref(&self) -> &EtcdAt {
        &self.at
    }
}

impl EtcdServer {
    /// Starts etcd and waits until it serves.
    pub async fn start() -> Self {
        let mut cluster = Self::cluster(1).await;
        cluster.pop().unwrap()
    }

    /// Starts an etcd cluster of `n` members on loopback and waits until every member serves.
    pub async fn cluster(n: usize) -> Vec<Self> {
        let at = |_| {
            let (client, peer) = (free_port(), free_port());
            let url = |port| format!("http://127.0.0.1:{port}");
            (url(client), url(peer), None)
        };
        Self::members(n, at).await
    }

    /// Starts an etcd cluster with a member in each namespace of `net`, so that one can be
    /// partitioned ([`netns::MemberNet::cut`]); waits until every member serves.
    pub async fn cluster_on(net: &netns::MemberNet, n: usize) -> Vec<Self> {
        let at = |i| {
            let ip = net.ip(i);
            (
                format!("http://{ip}:2379"),
                format!("http://{ip}:2380"),
                Some(net.namespace(i)),
            )
        };
        Self::members(n, at).await
    }

    /// Starts `n` members, member `i` at `at(i)`: (client URL, peer URL, namespace).
    async fn members(n: usize, at: impl Fn(usize) -> (String, String, Option<String>)) -> Vec<Self> {
        let urls: Vec<_> = (0..n).map(at).collect();
        let initial_cluster = (urls.iter().enumerate())
            .map(|(i, (_, peer, _))| format!("m{i}={peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members: Vec<Self> = (urls.into_iter().enumerate())
            .map(|(i, (client, peer_url, netns))| EtcdServer {
                child: None,
                dir: tempfile::Builder::new()
                    .prefix("podlock-etcd-")
                    .tempdir()
                    .unwrap(),
                name: format!("m{i}"),
                peer_url,
                initial_cluster: initial_cluster.clone(),
                netns,
                at: EtcdAt { endpoint: client },
            })
            .collect();
        for m in &mut members {
            m.spawn();
        }
        for m in &members {
            m.wait_healthy().await;
        }
        members
    }

    /// Whether this member is the cluster's leader now.
    pub async fn is_leader(&self) -> bool {
        match self.client().await.status().await {
            Ok(st) => st.header().is_some_and(|h| h.member_id() == st.leader()),
            Err(_) => false,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("etcd is running").id() as i32
    }

    /// Sends `sig` to it (SIGSTOP stalls it with its connections open, as a hung member).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) has no memory effects; the pid is our own child's.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Starts the stopped server again on the same ports and data.
    pub async fn resume(&mut self) {
        self.spawn();
        self.wait_healthy().await;
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let peer = &self.peer_url;
        let etcd = bin_dir().join("etcd");
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(etcd);
                c
            }
            None => Command::new(etcd),
        };
        let child = spawn_dying_with_parent(
            command
                .args(["--name", &self.name, "--data-dir"])
                .arg(self.dir.path().join("data"))
                .args([
                    "--listen-client-urls",
                    &self.endpoint,
                    "--advertise-client-urls",
                    &self.endpoint,
                ])
                .args(["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer])
                .args([
                    "--initial-cluster",
                    &self.initial_cluster,
                    "--initial-cluster-token",
                    "podlock-test",
                    ETCD_FEATURE_GATES,
                ])
                .stdout(Stdio::null())
                .stderr(log_file(self.dir.path(), "etcd.log")),
        );
        self.child = Some(child);
    }

    async fn wait_healthy(&self) {
        let healthy = wait_until(Duration::from_secs(20), || async {
            let url = format!("{}/health", self.endpoint);
            matches!(reqwest::get(url).await, Ok(r) if r.status().is_success())
        })
        .await;
        if healthy.is_err() {
            let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "etcd {} did not become healthy; its log ends:\n{}",
                self.name,
                tail.join("\n")
            );
        }
    }

    /// Kills etcd (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Wipes its data and starts it again, empty, at the same address: a bundled etcd
    /// reinstalled with fresh volumes. Its revisions start again from 1.
    pub async fn wipe(&mut self) {
        Self::rebuild(std::slice::from_mut(self), Rebuild::Wipe).await;
    }

    /// Saves a snapshot of its data to `file` (`etcdctl snapshot save`).
    pub fn snapshot(&self, file: &std::path::Path) {
        let out = Command::new(bin_dir().join("etcdctl"))
            .args(["--endpoints", &self.endpoint, "snapshot", "save"])
            .arg(file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "etcdctl snapshot save: {err}");
    }

    /// Replaces its data with `snapshot` (`etcdutl snapshot restore`, with `extra` flags such
    /// as `--bump-revision`) and starts it again at the same address.
    pub async fn restore(&mut self, snapshot: &std::path::Path, extra: &[&str]) {
        let how = Rebuild::Restore(snapshot, extra);
        Self::rebuild(std::slice::from_mut(self), how).await;
    }

    /// Turns on etcd auth with a `root` user whose password is `password`.
    pub async fn enable_auth(&self, password: &str) {
        let mut c = self.client().await;
        c.user_add("root", password, None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.auth_enable().await.unwrap();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sums every sample of metric `name` in Prometheus text.
pub fn sum_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The `p` quantile (0..1) of `samples`, nearest-rank; sorts them.
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1]
}

/// Runs `podlock declare` with `args` against `etcd`.
pub fn declare(etcd: &str, args: &[&str]) {
    let out = Command::new(podlock_bin())
        .args(["declare", "--etcd-endpoints", etcd])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "declare {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `check` every 20 ms until it is true; returns how long that took, or an error after
/// `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> Result<Duration, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("condition not met within {limit:?}"))
}

/// (RSS in MiB, CPU seconds) of a process, from /proc.
pub fn usage(pid: i32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map_or(0.0, |f| f.iter().filter_map(|t| t.parse::<f64>().ok()).sum());
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (rss_kb / 1024.0, ticks / hz)
}
