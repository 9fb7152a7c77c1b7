//! The peers: Go programs in `bench/peers` (etcd's `concurrency.Mutex`, a Redis `SET NX PX` lock,
//! client-go's Lease leader election), built with `go build`, and a `redis-server` to run on.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, spawn_dying_with_parent, wait_until};

const PEERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/peers");

/// The built peer programs.
pub struct Peers {
    dir: tempfile::TempDir,
}

impl Peers {
    /// Builds every peer (Go's build cache keeps rebuilds fast).
    pub fn build() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("podlock-peers-")
            .tempdir()
            .unwrap();
        for (module, pkg, name) in [
            ("", "./etcd-mutex", "etcd-mutex"),
            ("", "./redis-lock", "redis-lock"),
            ("lease-election", ".", "lease-election"),
        ] {
            let out = dir.path().join(name);
            let status = Command::new("go")
                .args(["build", "-o", out.to_str().unwrap(), pkg])
                .current_dir(PathBuf::from(PEERS).join(module))
                .status();
            assert!(
                status.is_ok_and(|s| s.success()),
                "go build of bench/peers {name} failed"
            );
        }
        Peers { dir }
    }

    /// A command for peer `name`.
    pub fn command(&self, name: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.dir.path().join(name));
        cmd.args(args);
        cmd
    }

    /// Runs one measurement of peer `name` and returns the JSON it prints.
    pub fn measure(&self, name: &str, args: &[&str]) -> serde_json::Value {
        let out = self.command(name, args).output().unwrap();
        assert!(
            out.status.success(),
            "{name} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// A `redis-server` (Debian's) on a free loopback port, without persistence; killed on drop.
pub struct Redis {
    child: Child,
    /// host:port
    pub addr: String,
}

impl Redis {
    pub async fn start() -> Self {
        let port = free_port().to_string();
        let child = spawn_dying_with_parent(
            Command::new("redis-server")
                .args([
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let addr = format!("127.0.0.1:{port}");
        wait_until(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(&addr).await.is_ok()
        })
        .await
        .expect("redis-server did not come up (scripts/setup.sh installs it)");
        Redis { child, addr }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Out = BufReader<std::process::ChildStdout>;

/// Starts `cmd` with its stdout piped.
fn spawn_piped(cmd: &mut Command) -> (Child, Out) {
    let mut child = spawn_dying_with_parent(cmd.stdout(Stdio::piped()).stderr(Stdio::null()));
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Reads lines until one starts with `word`.
fn read_until(out: &mut Out, word: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "peer exited before printing {word}");
        if line.starts_with(word) {
            return;
        }
    }
}

/// Failover of a peer: `holder` takes the lock (prints `held`), `waiter` queues behind it, the
/// holder gets `signal` (SIGKILL: it died; SIGSTOP: its node is gone), and the time until the
/// waiter prints `granted` is returned.
pub async fn failover(
    holder: &mut Command,
    held: &str,
    waiter: &mut Command,
    granted: &'static str,
    signal: i32,
) -> Duration {
    let (mut h, mut h_out) = spawn_piped(holder);
    read_until(&mut h_out, held);
    let (mut w, mut w_out) = spawn_piped(waiter);
    tokio::time::sleep(Duration::from_millis(500)).await; // the waiter is queued or polling
    unsafe { libc::kill(h.id() as i32, signal) };
    let at = Instant::now();
    let took = tokio::task::spawn_blocking(move || {
        read_until(&mut w_out, granted);
        at.elapsed()
    })
    .await
    .unwrap();
    for c in [&mut h, &mut w] {
        let _ = c.kill();
        let _ = c.wait();
    }
    took
}
