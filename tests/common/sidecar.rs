//! A `podlock sidecar` process for tests, on free loopback ports, with its log kept.

use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, log_file, podlock_bin, spawn_dying_with_parent, sum_metric, wait_until};

/// A `podlock sidecar` process; killed on drop.
pub struct Sidecar {
    child: Option<Child>,
    _logs: tempfile::TempDir,
    /// Base URL of its API.
    pub addr: String,
    /// Its pod name (the default holder id).
    pub pod: String,
}

impl Sidecar {
    /// Starts a sidecar for pod `pod` in namespace `default` with `extra` flags, waiting until
    /// its lock API serves (it has reached etcd).
    pub async fn start(etcd: &str, pod: &str, extra: &[&str]) -> Self {
        Self::start_logging(etcd, pod, extra, "info").await
    }

    /// [`Sidecar::start`] with `PODLOCK_LOG` set to `filter` (a benchmark turns on the marks
    /// of `podlock::path` this way).
    pub async fn start_logging(etcd: &str, pod: &str, extra: &[&str], filter: &str) -> Self {
        let sidecar = Self::spawn_logging(etcd, pod, extra, filter).await;
        wait_until(Duration::from_secs(10), || async {
            sidecar.get("/v1/locks").await.0 == 200
        })
        .await
        .unwrap_or_else(|e| panic!("the sidecar never reached etcd ({e}):\n{}", sidecar.log()));
        sidecar
    }

    /// Starts a sidecar as [`Sidecar::start`] does, waiting only until it listens.
    pub async fn spawn(etcd: &str, pod: &str, extra: &[&str]) -> Self {
        Self::spawn_logging(etcd, pod, extra, "info").await
    }

    async fn spawn_logging(etcd: &str, pod: &str, extra: &[&str], filter: &str) -> Self {
        let logs = log_dir();
        let listen = format!("127.0.0.1:{}", free_port());
        let child = spawn_dying_with_parent(
            Command::new(podlock_bin())
                .args([
                    "sidecar",
                    "--etcd-endpoints",
                    etcd,
                    "--listen",
                    &listen,
                    "--pod-name",
                    pod,
                ])
                .args(extra)
                .env("PODLOCK_LOG", filter)
                .stdout(Stdio::null())
                .stderr(log_file(logs.path(), "sidecar.log")),
        );
        let sidecar = Sidecar {
            child: Some(child),
            _logs: logs,
            addr: format!("http://{listen}"),
            pod: pod.into(),
        };
        wait_until(Duration::from_secs(10), || async {
            matches!(reqwest::get(format!("{}/healthz", sidecar.addr)).await, Ok(r) if r.status().is_success())
        })
        .await
        .unwrap_or_else(|e| panic!("the sidecar did not come up ({e}):\n{}", sidecar.log()));
        sidecar
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Whether its process still runs (it has not exited or crashed).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `sig` to it.
    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Kills it with SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        self.child.take().unwrap().wait().unwrap()
    }

    /// The sidecar's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._logs.path().join("sidecar.log")).unwrap_or_default()
    }

    /// `POST {addr}/v1/locks/{lock}/{verb}` with a JSON body; returns status and body.
    pub async fn post(&self, lock: &str, verb: &str, body: Value) -> (u16, Value) {
        let url = format!("{}/v1/locks/{lock}/{verb}", self.addr);
        let sent = http().post(&url).json(&body).send().await;
        let resp = sent.unwrap_or_else(|e| panic!("POST {url} {body} on {}: {e}", self.pod));
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `GET {addr}{path}`; returns status and body (JSON, else the text as a string).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.addr);
        let sent = http().get(&url).send().await;
        let resp = sent.unwrap_or_else(|e| panic!("GET {url} on {}: {e}", self.pod));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Acquires `lock` with `body` options; panics unless granted; returns the token.
    pub async fn must_acquire(&self, lock: &str, body: Value) -> i64 {
        let (status, grant) = self.post(lock, "acquire", body).await;
        assert_eq!(status, 200, "acquire {lock} on {}: {grant}", self.pod);
        grant["fencingToken"].as_i64().unwrap()
    }

    /// Sum of a counter or gauge family in its `/metrics`; panics if the family is missing (a
    /// missing metric is a defect, not a zero).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics").await;
        let text = text.as_str().unwrap();
        assert!(
            text.lines()
                .any(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{'])),
            "{name} missing from {}'s metrics:\n{text}",
            self.pod
        );
        sum_metric(text, name)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A directory for a sidecar's log: a temporary one, or one kept under `$PODLOCK_TEST_LOGS`
/// (to read every sidecar's log after a run, as the safety run's stalls were traced).
fn log_dir() -> tempfile::TempDir {
    let kept = std::env::var_os("PODLOCK_TEST_LOGS");
    let mut builder = tempfile::Builder::new();
    builder.prefix("podlock-sidecar-").disable_cleanup(kept.is_some());
    match kept {
        Some(dir) => builder.tempdir_in(dir),
        None => builder.tempdir(),
    }
    .unwrap()
}

/// A client for one request. Its timeout, far above the longest wait a test asks for (30 s),
/// makes a sidecar that never answers fail its test, naming the request, rather than hang the
/// whole run until CI's limit.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}
