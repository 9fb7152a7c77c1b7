//! Reading a sidecar's `/v1/locks/{lock}/events` stream in tests, with the same SSE parser as
//! `podlock lock`.

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;
use std::time::Duration;

use super::Sidecar;

type Frames = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// An open `/v1/locks/{lock}/events` stream.
pub struct Events(Frames);

impl Events {
    /// Opens the stream of `lock`'s events on `s`.
    pub async fn open(s: &Sidecar, lock: &str) -> Self {
        let resp = reqwest::get(format!("{}/v1/locks/{lock}/events", s.addr))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ctype.starts_with("text/event-stream"), "{ctype}");
        Events(resp.bytes_stream().eventsource().boxed())
    }

    /// The next event's JSON data, within `limit`.
    pub async fn next(&mut self, limit: Duration) -> Value {
        let event = tokio::time::timeout(limit, self.0.next())
            .await
            .expect("no event in time")
            .expect("stream open")
            .expect("a well-formed event");
        serde_json::from_str(&event.data).unwrap()
    }
}
