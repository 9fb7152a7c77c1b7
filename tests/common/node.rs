//! A real single-node cluster for tests: `scripts/control-plane.sh DIR --node` (etcd,
//! kube-apiserver reachable from pods, kube-controller-manager), `scripts/node.sh up DIR`
//! (containerd, runc, bridge CNI, CoreDNS, kubelet, kube-proxy, kube-scheduler) and the images of
//! `scripts/images.sh`, imported into the node's containerd.
//!
//! Needs root and what `scripts/setup.sh --node` installs. Where either is missing, [`Node::start`]
//! says why and the test skips, except under CI (`CI` set), where it fails: CI runs as root
//! after setup, so a missing piece there is a bug of setup, not a reason to skip.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::kube::client_for;
use super::{bin_dir, log_file, spawn_dying_with_parent, wait_until};

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts");

/// The node test bed: one node at a time on this machine (it owns the bridge `podlock0`), so
/// every test that starts one holds this first.
pub static BED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A control plane and a node of this machine; torn down on drop.
pub struct Node {
    _bed: tokio::sync::MutexGuard<'static, ()>,
    plane: Option<Child>,
    node: Option<Child>,
    dir: tempfile::TempDir,
    /// A kubeconfig with admin rights.
    pub kubeconfig: PathBuf,
    /// The images' names by their `images.env` variable (`PODLOCK_IMAGE`, `ETCD_IMAGE`, ...).
    pub images: HashMap<String, String>,
}

/// Whether a node can run here; prints why not and returns false (a test then skips), except
/// under CI, where it fails.
pub fn can_run() -> bool {
    let Some(why) = missing() else { return true };
    assert!(
        std::env::var_os("CI").is_none(),
        "a node test cannot run in CI: {why}"
    );
    eprintln!("SKIPPED: no real node on this machine: {why}");
    false
}

/// Why a node cannot run here, or `None` when it can.
fn missing() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (containerd, the kubelet and the pod network need root)".into());
    }
    let bin = bin_dir();
    for b in [
        "kubelet",
        "kube-proxy",
        "kube-scheduler",
        "coredns",
        "kube-router",
        "helm",
    ] {
        if !bin.join(b).exists() {
            return Some(format!(
                "no {}: run scripts/setup.sh --node",
                bin.join(b).display()
            ));
        }
    }
    for b in [
        "/usr/bin/containerd",
        "/usr/sbin/runc",
        "/usr/lib/cni/bridge",
        "/bin/busybox",
    ] {
        if !Path::new(b).exists() {
            return Some(format!("no {b}: run scripts/setup.sh --node"));
        }
    }
    None
}

impl Node {
    /// Starts the control plane and the node and imports the images built from `podlock`;
    /// `None` (with a printed reason) when this machine cannot run a node outside CI.
    pub async fn start(podlock: &str) -> Option<Self> {
        if !can_run() {
            return None;
        }
        let bed = BED.lock().await;
        let dir = tempfile::Builder::new()
            .prefix("podlock-node-")
            .tempdir()
            .unwrap();
        let images = build_images(dir.path(), podlock);
        let plane = spawn_dying_with_parent(
            Command::new("bash")
                .arg(format!("{SCRIPTS}/control-plane.sh"))
                .arg(dir.path())
                .arg("--node")
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "control-plane.log")),
        );
        let mut node = Node {
            _bed: bed,
            plane: Some(plane),
            node: None,
            kubeconfig: dir.path().join("kubeconfig"),
            images,
            dir,
        };
        node.wait_for("ready", "control plane", 120).await;
        node.node = Some(spawn_terminated_with_parent(
            Command::new("bash")
                .arg(format!("{SCRIPTS}/node.sh"))
                .args(["up"])
                .arg(node.dir.path())
                .arg(node.dir.path().join("images"))
                .stdout(Stdio::null())
                .stderr(log_file(node.dir.path(), "node.log")),
        ));
        node.wait_for("node/ready", "node", 180).await;
        Some(node)
    }

    async fn wait_for(&self, file: &str, what: &str, seconds: u64) {
        let path = self.dir.path().join(file);
        if wait_until(Duration::from_secs(seconds), || async { path.exists() })
            .await
            .is_err()
        {
            panic!("{what} not ready within {seconds} s:\n{}", self.logs());
        }
    }

    /// The ends of the scripts' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for log in ["control-plane.log", "node.log", "node/kubelet.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!(
                "--- {log} (last 15 lines)\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        out
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        run(Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args))
    }

    /// Runs kubectl with `stdin` as its input, panicking on failure; returns stdout.
    pub fn kubectl_apply(&self, yaml: &str) -> String {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A client with admin rights.
    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig).await
    }

    /// Runs `ctr` against the node's containerd (namespace `k8s.io`); returns (success,
    /// stdout, stderr).
    pub fn ctr(&self, args: &[&str]) -> (bool, String, String) {
        let socket = self.dir.path().join("node/containerd.sock");
        run(Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io"])
            .args(args))
    }

    /// Runs helm against this cluster; returns (success, stdout, stderr).
    pub fn helm(&self, args: &[&str]) -> (bool, String, String) {
        run(Command::new(bin_dir().join("helm"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // node.sh tears down on SIGTERM; wait for that before the control plane goes.
        if let Some(mut node) = self.node.take() {
            unsafe { libc::kill(node.id() as i32, libc::SIGTERM) };
            let _ = node.wait();
        }
        if let Some(mut plane) = self.plane.take() {
            let _ = plane.kill();
            let _ = plane.wait();
        }
    }
}

/// Calls `check` every 200 ms until it returns `Ok`, for at most `limit`; returns its last result.
pub fn retry<T>(limit: Duration, mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let start = std::time::Instant::now();
    loop {
        let result = check();
        if result.is_ok() || start.elapsed() > limit {
            return result;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{:?}: {e}", cmd.get_program()));
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// Like [`spawn_dying_with_parent`], but with SIGTERM, so that a script can clean up.
fn spawn_terminated_with_parent(cmd: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Runs `scripts/images.sh DIR/images podlock`; returns the images' names.
fn build_images(dir: &Path, podlock: &str) -> HashMap<String, String> {
    let images = dir.join("images");
    let (ok, _, err) = run(Command::new("bash")
        .arg(format!("{SCRIPTS}/images.sh"))
        .arg(&images)
        .arg(podlock));
    assert!(ok, "scripts/images.sh: {err}");
    std::fs::read_to_string(images.join("images.env"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
