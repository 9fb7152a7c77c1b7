//! A real Kubernetes control plane for tests, started the way controller-runtime's envtest does:
//! etcd, `kube-apiserver` (self-signed serving certificate, a service-account key, a static
//! admin token in `system:masters`) and, on request, `kube-controller-manager`. No kubelet:
//! tests create Pods and set their status themselves.
//!
//! One control plane serves every test of a test binary ([`shared`]); tests isolate themselves
//! by namespace. Its processes are started from a thread that lives as long as the test binary
//! and die with it (PR_SET_PDEATHSIG).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::{EtcdServer, bin_dir, free_port, log_file, spawn_dying_with_parent};

/// A running control plane.
pub struct ControlPlane {
    /// The etcd behind the API server; podlock's locks live in it too, under `/podlock/`.
    pub etcd: EtcdServer,
    _apiserver: Child,
    _controller_manager: Child,
    _dir: tempfile::TempDir,
    /// A kubeconfig with admin rights.
    pub kubeconfig: PathBuf,
}

const TOKEN: &str = "podlock-test-admin-token";

/// The shared control plane with the DistributedLock CRD installed and established.
pub fn with_crd() -> &'static ControlPlane {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let plane = shared();
    INSTALLED.get_or_init(|| {
        let crd = include_str!("../../crds/distributedlock.yaml");
        let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], crd);
        assert!(ok, "CRD apply: {err}");
        let (ok, _, err) = plane.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/distributedlocks.podlock.io",
        ]);
        assert!(ok, "CRD not established: {err}");
    });
    plane
}

/// The control plane shared by the tests of this binary, started on first use.
pub fn shared() -> &'static ControlPlane {
    static PLANE: OnceLock<&'static ControlPlane> = OnceLock::new();
    PLANE.get_or_init(|| {
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
    })
}

impl ControlPlane {
    async fn start() -> Self {
        let etcd = EtcdServer::start().await;
        let dir = tempfile::Builder::new()
            .prefix("podlock-kube-")
            .tempdir()
            .unwrap();
        let path = |f: &str| dir.path().join(f);
        let openssl = Command::new("openssl")
            .args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"])
            .arg(path("sa.key"))
            .status()
            .expect("openssl");
        assert!(openssl.success(), "could not make a service-account key");
        std::fs::write(
            path("tokens.csv"),
            format!("{TOKEN},admin,admin,\"system:masters\"\n"),
        )
        .unwrap();
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let mut cmd = Command::new(bin_dir().join("kube-apiserver"));
        cmd.arg(format!("--etcd-servers={}", etcd.endpoint))
            .arg(format!("--cert-dir={}", path("certs").display()))
            .arg(format!("--secure-port={port}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg(format!("--service-account-issuer={url}"))
            .arg(format!("--service-account-key-file={}", path("sa.key").display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                path("sa.key").display()
            ))
            .arg(format!("--token-auth-file={}", path("tokens.csv").display()))
            .args(["--authorization-mode=RBAC", "--allow-privileged=true"])
            .stdout(Stdio::null())
            .stderr(log_file(dir.path(), "kube-apiserver.log"));
        let apiserver = spawn_dying_with_parent(&mut cmd);
        let kubeconfig = path("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    \
                 certificate-authority: {ca}\nusers:\n- name: admin\n  user:\n    token: {TOKEN}\n\
                 contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n    namespace: default\n\
                 current-context: test\n",
                ca = path("certs/apiserver.crt").display()
            ),
        )
        .unwrap();
        super::wait_until(Duration::from_secs(90), || async {
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["get", "--raw", "/readyz"])
                .output();
            matches!(out, Ok(o) if o.status.success())
        })
        .await
        .unwrap_or_else(|e| panic!("kube-apiserver not ready ({e}); log in {}", dir.path().display()));
        let mut cmd = Command::new(bin_dir().join("kube-controller-manager"));
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--service-account-private-key-file={}",
                path("sa.key").display()
            ))
            .args([
                "--leader-elect=false",
                "--controllers=*",
                "--use-service-account-credentials=false",
            ])
            .arg(format!("--secure-port={}", free_port()))
            .args(["--bind-address=127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(log_file(dir.path(), "kube-controller-manager.log"));
        let controller_manager = spawn_dying_with_parent(&mut cmd);
        ControlPlane {
            etcd,
            _apiserver: apiserver,
            _controller_manager: controller_manager,
            _dir: dir,
            kubeconfig,
        }
    }

    /// A client with admin rights (one per test: clients belong to the test's runtime).
    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Runs kubectl against the control plane; returns (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        self.kubectl_stdin(args, "")
    }

    /// Runs kubectl with `stdin` as its input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
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
        Self::start_as(plane, &plane.kubeconfig, ns, etcd, extra).await
    }

    /// Like [`Operator::start_with`], with the identity of `kubeconfig`.
    pub async fn start_as(
        plane: &ControlPlane,
        kubeconfig: &std::path::Path,
        ns: &str,
        etcd: &str,
        extra: &[&str],
    ) -> Self {
        let _ = plane;
        let configuration = format!("podlock-{ns}");
        let configuration: &[&str] = if extra.contains(&"--webhook-configuration") {
            &[]
        } else {
            &["--webhook-configuration", &configuration]
        };
        let logs = tempfile::Builder::new()
            .prefix("podlock-operator-")
            .tempdir()
            .unwrap();
        let listen = format!("127.0.0.1:{}", free_port());
        let hook = format!("127.0.0.1:{}", free_port());
        let child = spawn_dying_with_parent(
            Command::new(super::podlock_bin())
                .args(["operator", "--etcd-endpoints", etcd, "--listen", &listen])
                .args(["--watch-namespace", ns, "--leader-election-namespace", ns])
                .args([
                    "--webhook-listen",
                    &hook,
                    "--webhook-url",
                    &format!("https://{hook}/mutate"),
                ])
                .args(configuration)
                .args(["--operator-namespace", ns])
                .args(["--sidecar-image", "podlock:test"])
                .args(extra)
                .args([
                    "--leader-election-id",
                    "podlock-operator",
                    "--leader-lease-seconds",
                    "3",
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
