//! `examples/fenced_store.py`, the fenced counter, run by the tests.

use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, spawn_dying_with_parent, wait_until};

/// `examples/fenced_store.py` on a free port, logging every accepted write; stopped on drop.
pub struct FencedStore {
    child: Child,
    log: tempfile::TempDir,
    /// Its base URL.
    pub url: String,
}

/// One write the store accepted, from its log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AcceptedWrite {
    /// When the store accepted it: seconds since the Unix epoch (wall clock).
    pub at: f64,
    /// The fencing token it carried.
    pub token: i64,
    /// The counter's value after it.
    pub value: u64,
}

impl FencedStore {
    /// Starts the store and waits until it answers as the store does; on another port if its
    /// own was taken meanwhile (another process's server answered on it while the store
    /// exited: the safety run once failed so).
    pub async fn start() -> Self {
        for _ in 0..5 {
            let mut store = Self::spawn();
            let answers = wait_until(Duration::from_secs(10), || async {
                let state = reqwest::get(format!("{}/", store.url)).await;
                let state: Option<Value> = match state {
                    Ok(r) => r.json().await.ok(),
                    Err(_) => None,
                };
                state.is_some_and(|s| s.get("highest").is_some())
            })
            .await;
            if answers.is_ok() && store.child.try_wait().unwrap().is_none() {
                return store;
            }
        }
        panic!("the fenced store did not come up on any of five ports");
    }

    fn spawn() -> Self {
        let port = free_port();
        let log = tempfile::Builder::new()
            .prefix("podlock-store-")
            .tempdir()
            .unwrap();
        let child = spawn_dying_with_parent(
            Command::new("python3")
                .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/fenced_store.py"))
                .arg(port.to_string())
                .arg(log.path().join("writes.log"))
                .stdout(Stdio::null()),
        );
        FencedStore {
            child,
            log,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Its state: `{value, accepted, rejected, highest}`.
    pub async fn state(&self) -> Value {
        reqwest::get(format!("{}/", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Writes to it with fencing token `token` as `writer`; returns the HTTP status (200
    /// accepted, 409 a token below the highest it has seen).
    pub async fn write(&self, token: i64, writer: &str) -> u16 {
        let url = format!("{}/increment?token={token}&writer={writer}", self.url);
        let resp = reqwest::Client::new().post(url).send().await.unwrap();
        resp.status().as_u16()
    }

    /// Every accepted write so far, in the order the store accepted them.
    pub fn accepted(&self) -> Vec<AcceptedWrite> {
        let text = self.log_text();
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                AcceptedWrite {
                    at: field(&f, 0, line),
                    token: field(&f, 1, line),
                    value: field(&f, 3, line),
                }
            })
            .collect()
    }

    /// Its log of accepted writes: one line each, `TIME TOKEN WRITER VALUE`.
    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path().join("writes.log")).unwrap_or_default()
    }

    /// When the store accepted each write of `writer` (the `writer=` of its request), in
    /// seconds since the Unix epoch, in order.
    pub fn accepted_from(&self, writer: &str) -> Vec<f64> {
        let text = self.log_text();
        text.lines()
            .map(|line| line.split(' ').collect::<Vec<_>>())
            .filter(|f| f.get(2) == Some(&writer))
            .map(|f| field(&f, 0, &f.join(" ")))
            .collect()
    }
}

/// Field `i` of a log line split into `f`.
fn field<T: std::str::FromStr>(f: &[&str], i: usize, line: &str) -> T {
    f.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad store log line {line:?}"))
}

impl Drop for FencedStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
