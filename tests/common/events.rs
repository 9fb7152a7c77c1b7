//! Reading a sidecar's `/v1/locks/{lock}/events` stream in tests.

use serde_json::Value;
use std::time::Duration;

use super::Sidecar;

/// An open `/v1/locks/{lock}/events` stream.
pub struct Events(reqwest::Response, String);

impl Events {
    /// Opens the stream of `lock`'s events on `s`.
    pub async fn open(s: &Sidecar, lock: &str) -> Self {
        let resp = reqwest::get(format!("{}/v1/locks/{lock}/events", s.addr))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        Events(resp, String::new())
    }

    /// The next event's JSON data, within `limit`.
    pub async fn next(&mut self, limit: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(end) = self.1.find("\n\n") {
                let frame: String = self.1.drain(..end + 2).collect();
                let data: String = frame.lines().filter_map(|l| l.strip_prefix("data:")).collect();
                if !data.trim().is_empty() {
                    return serde_json::from_str(data.trim()).unwrap();
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.0.chunk())
                .await
                .expect("no event in time");
            self.1
                .push_str(std::str::from_utf8(&chunk.unwrap().expect("stream open")).unwrap());
        }
    }
}
