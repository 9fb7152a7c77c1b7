//! A real Kubernetes control plane for tests, started by `scripts/control-plane.sh` (the way
//! controller-runtime's envtest does: etcd, `kube-apiserver` with a self-signed serving
//! certificate, a service-account key and a static admin token, `kube-controller-manager`).
//! No kubelet: tests create Pods and set their status themselves.
//!
//! One control plane serves every test of a test binary ([`shared`]); tests isolate themselves
//! by namespace. Its processes are started from a thread that lives as long as the test binary
//! and die with it (PR_SET_PDEATHSIG).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use super::{EtcdAt, free_port, log_file, spawn_dying_with_parent};

/// A running control plane.
pub struct ControlPlane {
    /// The etcd behind the API server; podlock's locks live in it too, under `/podlock/`.
    pub etcd: EtcdAt,
    _script: Child,
    _dir: tempfile::TempDir,
    /// A kubeconfig with admin rights.
    pub kubeconfig: PathBuf,
}

/// A client with the identity of `kubeconfig`.
pub async fn client_for(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The shared control plane with the DistributedLock CRD installed and established.
pub fn with_crd() -> &'static ControlPlane {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let plane = shared();
    INSTALLED.get_or_init(|| install_crd(plane));
    plane
}

/// A second control plane with the CRD, started on first use: another cluster, for the tests
/// of locks that several clusters share.
pub fn other_cluster() -> &'static ControlPlane {
    static PLANE: OnceLock<&'static ControlPlane> = OnceLock::new();
    let plane = PLANE.get_or_init(start_for_good);
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| install_crd(plane));
    plane
}

fn install_crd(plane: &ControlPlane) {
    let crd = include_str!("../../crds/distributedlock.yaml");
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], crd);
    assert!(ok, "CRD apply: {err}");
    // `kubectl wait` fails at once, rather than waiting, while the new CRD has no conditions
    // yet ("<nil> is of the type <nil>"): once in a safety run's loop. So it is asked again.
    let mut last = String::new();
    for _ in 0..60 {
        let (ok, _, err) = plane.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/distributedlocks.podlock.io",
        ]);
        if ok {
            return;
        }
        last = err;
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("CRD not established within 15 s: {last}");
}

/// The control plane shared by the tests of this binary, started on first use.
pub fn shared() -> &'static ControlPlane {
    static PLANE: OnceLock<&'static ControlPlane> = OnceLock::new();
    PLANE.get_or_init(start_for_good)
}

/// Starts a control plane that lives as long as the test binary.
fn start_for_good() -> &'static ControlPlane {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let plane: &'static ControlPlane = Box::leak(Box::new(rt.block_on(ControlPlane::start())));
        tx.send(plane).unwrap();
        loop {
            std::thread::park(); // keep the processes' parent thread alive
        }
    });
    rx.recv().expect("control plane failed to start")
}

impl ControlPlane {
    /// Starts `scripts/control-plane.sh` and waits until it reports ready.
    async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("podlock-kube-")
            .tempdir()
            .unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/control-plane.sh");
        let script = spawn_dying_with_parent(
            Command::new("bash")
                .arg(script)
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(log_file(dir.path(), "control-plane.log")),
        );
        super::wait_until(Duration::from_secs(120), || async {
            dir.path().join("ready").exists()
        })
        .await
        .unwrap_or_else(|e| panic!("control plane not ready ({e}); logs in {}", dir.path().display()));
        let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .map(str::to_string)
                .expect(name)
        };
        ControlPlane {
            etcd: EtcdAt {
                endpoint: var("ETCD_ENDPOINT"),
            },
            kubeconfig: var("KUBECONFIG").into(),
            _script: script,
            _dir: dir,
        }
    }

    /// A client with admin rights (one per test: clients belong to the test's runtime).
    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig).await
    }

    /// Runs kubectl against the control plane; returns (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        self.kubectl_stdin(args, "")
    }

    /// Runs kubectl with `stdin` as its input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        kubectl_as(&self.kubeconfig, args, stdin)
    }

    /// A kubeconfig (in the returned directory) with a token of ServiceAccount `account` of
    /// namespace `ns`, to run something with exactly that account's rights.
    pub fn token_kubeconfig(&self, ns: &str, account: &str) -> (tempfile::TempDir, PathBuf) {
        let (ok, token, err) = self.kubectl(&["create", "token", account, "-n", ns, "--duration=1h"]);
        assert!(ok, "{err}");
        let admin = std::fs::read_to_string(&self.kubeconfig).unwrap();
        let (_, admin_token) = admin.split_once("token: ").unwrap();
        let admin_token = admin_token.lines().next().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, admin.replace(admin_token, token.trim())).unwrap();
        (dir, kubeconfig)
    }

    /// Creates a namespace for one test.
    pub fn namespace(&self, name: &str) -> String {
        let (ok, _, err) = self.kubectl(&["create", "namespace", name]);
        assert!(
            ok || err.contains("AlreadyExists"),
            "create namespace {name}: {err}"
        );
        name.to_string()
    }
}

/// Runs kubectl with the identity of `kubeconfig` and `stdin` as its input; returns (success,
/// stdout, stderr).
pub fn kubectl_as(kubeconfig: &std::path::Path, args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// A `podlock operator` process; killed on drop.
pub struct Operator {
    child: Option<Child>,
    logs: tempfile::TempDir,
    /// Base URL of its health and metrics server.
    pub addr: String,
}

impl Operator {
    /// Starts an operator for namespace `ns` of `plane` (its leader Lease in that namespace
    /// too, so tests do not contend), waiting until it serves.
    pub async fn start(plane: &ControlPlane, ns: &str) -> Self {
        Self::start_with(plane, ns, &plane.etcd.endpoint, &[]).await
    }

    /// Like [`Operator::start`], with podlock's locks in the etcd at `etcd` and `extra` flags.
    pub async fn start_with(plane: &ControlPlane, ns: &str, etcd: &str, extra: &[&str]) -> Self {
        Self::start_as(&plane.kubeconfig, ns, etcd, extra).await
    }

    /// Like [`Operator::start_with`], with the identity of `kubeconfig`.
    pub async fn start_as(kubeconfig: &std::path::Path, ns: &str, etcd: &str, extra: &[&str]) -> Self {
        Self::launch(
            kubeconfig,
            ns,
            etcd,
            &[&["--watch-namespace", ns], extra].concat(),
        )
        .await
    }

    /// An operator of every namespace of `plane` (its own things in `ns`), as the chart runs it.
    pub async fn start_cluster_wide(plane: &ControlPlane, ns: &str, extra: &[&str]) -> Self {
        Self::launch(&plane.kubeconfig, ns, &plane.etcd.endpoint, extra).await
    }

    async fn launch(kubeconfig: &std::path::Path, ns: &str, etcd: &str, extra: &[&str]) -> Self {
        // A flag given in `extra` replaces the default below (clap refuses one given twice).
        let default = |flag: &'static str, value: String| match extra.contains(&flag) {
            true => vec![],
            false => vec![flag.to_string(), value],
        };
        let logs = tempfile::Builder::new()
            .prefix("podlock-operator-")
            .tempdir()
            .unwrap();
        let listen = format!("127.0.0.1:{}", free_port());
        let hook = format!("127.0.0.1:{}", free_port());
        let configuration = default("--webhook-configuration", format!("podlock-{ns}"));
        let url = default("--webhook-url", format!("https://{hook}/mutate"));
        let child = spawn_dying_with_parent(
            Command::new(super::podlock_bin())
                .args(["operator", "--etcd-endpoints", etcd, "--listen", &listen])
                .args(["--leader-election-namespace", ns])
                .args(["--webhook-listen", &hook])
                .args(url)
                .args(configuration)
                .args(["--operator-namespace", ns])
                .args(["--sidecar-image", "podlock:test"])
                .args(extra)
                .args([
                    "--leader-election-id",
                    "podlock-operator",
                    "--leader-lease-seconds",
                    "3",
                    "--leader-renew-deadline-seconds",
                    "2",
                    "--leader-retry-period-seconds",
                    "1",
                ])
                .env("KUBECONFIG", kubeconfig)
                .env("PODLOCK_LOG", "info,kube=warn")
                .stdout(Stdio::null())
                .stderr(log_file(logs.path(), "operator.log")),
        );
        let op = Operator {
            child: Some(child),
            logs,
            addr: format!("http://{listen}"),
        };
        super::wait_until(Duration::from_secs(20), || async {
            matches!(reqwest::get(format!("{}/healthz", op.addr)).await, Ok(r) if r.status().is_success())
        })
        .await
        .unwrap_or_else(|e| panic!("operator not up ({e}):\n{}", op.log()));
        op
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("operator.log")).unwrap_or_default()
    }

    /// Sends `sig` to it.
    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Its exit status, if it exits within `limit`.
    pub async fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.as_mut()?.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Whether it leads, by its `podlock_operator_leader` metric.
    pub async fn leads(&self) -> bool {
        self.metrics()
            .await
            .lines()
            .any(|l| l == "podlock_operator_leader 1")
    }

    /// Its successful reconciliations so far (`podlock_reconcile_total{result="ok"}`).
    pub async fn reconciles(&self) -> u64 {
        let [ok] = self
            .metric_values(["podlock_reconcile_total{result=\"ok\"}"])
            .await;
        ok as u64
    }

    /// The values of some series of its metrics (name and labels as printed), from one scrape;
    /// 0 for one that is absent.
    pub async fn metric_values<const N: usize>(&self, series: [&str; N]) -> [f64; N] {
        let metrics = self.metrics().await;
        series.map(|name| {
            let line =
                (metrics.lines()).find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ')));
            line.and_then(|l| l.split_whitespace().last()?.parse().ok())
                .unwrap_or(0.0)
        })
    }

    /// Its /metrics text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// RFC 3339 with milliseconds, as the API server writes times.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Creates a running pod (app container + podlock sidecar) and returns its uid.
pub async fn running_pod(pods: &Api<Pod>, name: &str) -> String {
    running_pod_labelled(pods, name, json!({"podlock.io/sidecar": "true"})).await
}

/// Like [`running_pod`], with `labels` instead of the label injection sets.
pub async fn running_pod_labelled(pods: &Api<Pod>, name: &str, labels: Value) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "app"}, {"name": "podlock", "image": "podlock"}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    set_status(pods, name, "Running", SystemTime::now() - Duration::from_secs(60)).await;
    created.metadata.uid.unwrap()
}

/// Writes the pod's phase and its app container's start time, as a kubelet would.
pub async fn set_status(pods: &Api<Pod>, name: &str, phase: &str, app_started: SystemTime) {
    set_app(pods, name, phase, (app_started, 0)).await
}

/// Writes that the pod's app container restarted at `at`, as a kubelet would (its restart count
/// up by one).
pub async fn set_restarted(pods: &Api<Pod>, name: &str, at: SystemTime) {
    set_app(pods, name, "Running", (at, 1)).await
}

/// Writes the pod's phase and its app container's start time and restart count.
async fn set_app(pods: &Api<Pod>, name: &str, phase: &str, (started, restarts): (SystemTime, i32)) {
    let status = json!({"status": {"phase": phase, "containerStatuses": [{
        "name": "app", "image": "app", "imageID": "", "ready": true, "restartCount": restarts, "started": true,
        "state": {"running": {"startedAt": rfc3339(started)}}
    }]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}
