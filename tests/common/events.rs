//! Reading a sidecar's event streams in tests (`/v1/locks/{lock}/events`, `/watch`), with the
//! same SSE parser as `podlock lock`.

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::pin::Pin;
use std::time::Duration;

use super::Sidecar;

type Frames = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// An open event stream.
pub struct Events(Frames);

impl Events {
    /// Opens the stream of `lock`'s events on `s`.
    pub async fn open(s: &Sidecar, lock: &str) -> Self {
        Self::open_at(s, &format!("/v1/locks/{lock}/events")).await
    }

    /// Opens the event stream at `path` on `s`; panics unless it answers 200 with one.
    pub async fn open_at(s: &Sidecar, path: &str) -> Self {
        let resp = reqwest::get(format!("{}{path}", s.addr)).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}: {:?}", resp.text().await);
        Self::of_response(resp)
    }

    /// The event stream a response carries (a `POST .../hold`'s, say); panics unless it is one.
    pub fn of_response(resp: reqwest::Response) -> Self {
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ctype.starts_with("text/event-stream"), "{ctype}");
        Events(resp.bytes_stream().eventsource().boxed())
    }

    /// The next event's JSON data, within `limit`.
    pub async fn next(&mut self, limit: Duration) -> Value {
        self.next_named(limit).await.1
    }

    /// The next event's name and JSON data, within `limit`.
    pub async fn next_named(&mut self, limit: Duration) -> (String, Value) {
        let event = self
            .within(limit)
            .await
            .expect("no event in time")
            .expect("stream open");
        let event = event.expect("a well-formed event");
        (event.event, serde_json::from_str(&event.data).unwrap())
    }

    /// Panics if an event comes within `quiet`.
    pub async fn none_within(&mut self, quiet: Duration) {
        if let Some(event) = self.within(quiet).await {
            panic!("an event within {quiet:?}: {event:?}");
        }
    }

    /// Whether the stream ends (the server closes it) within `limit`, with no further event.
    pub async fn ends_within(&mut self, limit: Duration) -> bool {
        matches!(self.within(limit).await, Some(None))
    }

    /// The next item of the stream (`None` inside: it ended), or `None` if none came in `limit`.
    async fn within(
        &mut self,
        limit: Duration,
    ) -> Option<Option<Result<Event, EventStreamError<reqwest::Error>>>> {
        tokio::time::timeout(limit, self.0.next()).await.ok()
    }
}
