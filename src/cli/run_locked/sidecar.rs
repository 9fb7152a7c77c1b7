//! The sidecar's HTTP API as `podlock lock` uses it: a hold bound to its connection, with the
//! stream of its events, and its release.

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

/// The events of a hold bound to its connection, after its grant.
pub(super) type HoldEvents =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<eventsource_stream::Event, String>> + Send>>;

/// The sidecar's API for one lock and holder.
#[derive(Clone)]
pub(super) struct Sidecar {
    http: reqwest::Client,
    base: String,
    holder: String,
}

/// How a release ended.
pub(super) enum Released {
    /// Released.
    Yes,
    /// The sidecar says the hold had ended before (410): CMD may have run unprotected.
    Lost,
    /// No answer: the lease will end the hold.
    Unknown,
}

impl Sidecar {
    /// The API of lock `name` at the sidecar listening on `addr`, for `holder`.
    pub(super) fn new(addr: &str, name: &str, holder: String) -> Self {
        Sidecar {
            http: reqwest::Client::new(),
            base: format!("{}/v1/locks/{name}", addr.trim_end_matches('/')),
            holder,
        }
    }

    /// The holder id it holds as.
    pub(super) fn holder(&self) -> &str {
        &self.holder
    }

    /// Takes the lock bound to this connection, asking `options`: the grant and the rest of the
    /// stream, or `None` (said on stderr) if the locks named `names` could not be acquired.
    pub(super) async fn hold(
        &self,
        options: &Value,
        names: &str,
    ) -> anyhow::Result<Option<(Value, HoldEvents)>> {
        let resp = self
            .http
            .post(format!("{}/hold", self.base))
            .json(options)
            .send()
            .await?;
        if !resp.status().is_success() {
            let error: Value = resp.json().await?;
            let why = error["message"].as_str().unwrap_or("?");
            eprintln!("podlock: could not acquire {names}: {why}");
            return Ok(None);
        }
        let mut events: HoldEvents = Box::pin(
            resp.bytes_stream()
                .eventsource()
                .map(|e| e.map_err(|e| e.to_string())),
        );
        match events.next().await {
            Some(Ok(first)) if first.event == "acquired" => {
                Ok(Some((serde_json::from_str(&first.data)?, events)))
            }
            other => anyhow::bail!("the sidecar's hold stream began without a grant: {other:?}"),
        }
    }

    /// Releases the hold of lock `name`.
    pub(super) async fn release(&self, name: &str) -> Released {
        let body = json!({ "holderId": self.holder });
        match self
            .http
            .post(format!("{}/release", self.base))
            .json(&body)
            .send()
            .await
        {
            Ok(r) if r.status() == reqwest::StatusCode::GONE => {
                let why = r.json::<Value>().await.unwrap_or_default();
                eprintln!(
                    "podlock: lock {name} had been lost before its release: {}",
                    why["message"]
                );
                Released::Lost
            }
            Ok(_) => Released::Yes,
            Err(e) => {
                eprintln!("podlock: release of {name} failed ({e}); the lease will end it");
                Released::Unknown
            }
        }
    }
}
