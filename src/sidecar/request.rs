//! Parsing of request options from the query string and the JSON body, with errors a person
//! can act on. The body wins where both name a field.

use axum::body::Bytes;
use axum::http::{StatusCode, Uri};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

use super::error::ApiError;
use crate::lock::{HEARTBEAT, REQUEST_MAX_HOLD, TTL, WARNING_FIELD, check_container};
use crate::lock::{LockId, Mode};

/// The longest an acquire may wait, in seconds.
pub const MAX_WAIT_SECONDS: f64 = 3600.0;

/// The longest gap between a stream's keep-alive comment lines (`/hold`, `/watch`), in seconds.
pub const MAX_KEEP_ALIVE_SECONDS: u32 = 300;

/// A stream's keep-alive comment lines this often by default: below the 60 s idle timeout of
/// common proxies.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Options of `POST /v1/locks/{name}/acquire`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcquireOptions {
    /// Seconds to wait in the queue (default 30; 0: try once).
    pub wait_seconds: Option<f64>,
    /// The holder id (default: the pod name).
    pub holder_id: Option<String>,
    /// Lease TTL for this hold.
    pub ttl_seconds: Option<u32>,
    /// Heartbeat window for this hold.
    pub heartbeat_timeout_seconds: Option<u32>,
    /// The longest the hold may last, in seconds (at most the lock's `maxHoldSeconds`).
    pub max_hold_seconds: Option<u32>,
    /// How long before the hold's deadline its `deadline` event comes, in seconds.
    pub deadline_warning_seconds: Option<u32>,
    /// The app container that asks (its `PODLOCK_CONTAINER`).
    pub container: Option<String>,
    /// `POST .../hold` only: seconds between the comment lines that keep the stream alive.
    pub keep_alive_seconds: Option<u32>,
    /// `exclusive` (default) or `shared` (a reader-writer lock).
    pub mode: Option<Mode>,
    /// How many of a semaphore's slots the hold takes (default 1; at most `maxHolders`).
    pub permits: Option<u32>,
    /// Further locks to take as one with the path's (a multi-lock acquire): a JSON list of
    /// names in the body, or a comma-separated list in the query string.
    #[serde(default, deserialize_with = "names")]
    pub with: Option<Vec<String>>,
}

/// A list of lock names: a JSON list, or a string of names separated by commas.
fn names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        List(Vec<String>),
        Commas(String),
    }
    Ok(Some(match Names::deserialize(d)? {
        Names::List(list) => list,
        Names::Commas(s) => s.split(',').map(|n| n.trim().to_string()).collect(),
    }))
}

/// Options of release and heartbeat.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HolderOptions {
    /// The holder id (default: the pod name).
    pub holder_id: Option<String>,
}

/// Merges two option sets field by field, `body` first.
pub trait Merge {
    /// `self` with every field `body` sets taken from `body`.
    fn merge(self, body: Self) -> Self;
}

impl Merge for AcquireOptions {
    fn merge(self, body: Self) -> Self {
        AcquireOptions {
            wait_seconds: body.wait_seconds.or(self.wait_seconds),
            holder_id: body.holder_id.or(self.holder_id),
            ttl_seconds: body.ttl_seconds.or(self.ttl_seconds),
            heartbeat_timeout_seconds: body.heartbeat_timeout_seconds.or(self.heartbeat_timeout_seconds),
            max_hold_seconds: body.max_hold_seconds.or(self.max_hold_seconds),
            deadline_warning_seconds: body.deadline_warning_seconds.or(self.deadline_warning_seconds),
            container: body.container.or(self.container),
            keep_alive_seconds: body.keep_alive_seconds.or(self.keep_alive_seconds),
            mode: body.mode.or(self.mode),
            permits: body.permits.or(self.permits),
            with: body.with.or(self.with),
        }
    }
}

impl Merge for HolderOptions {
    fn merge(self, body: Self) -> Self {
        HolderOptions {
            holder_id: body.holder_id.or(self.holder_id),
        }
    }
}

/// Reads options from the query string and the body (empty, or a JSON object).
pub fn options<T: DeserializeOwned + Default + Merge>(
    uri: &Uri,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is over 1 MiB; send a small JSON object",
            )
        } else {
            ApiError::invalid(format!("could not read the request body: {e}"))
        }
    })?;
    let query: T = match uri.query() {
        Some(q) => {
            serde_urlencoded::from_str(q).map_err(|e| ApiError::invalid(format!("bad query string: {e}")))?
        }
        None => T::default(),
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(query);
    }
    let parsed: T = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body))
        .map_err(|e| {
            let at = match e.path().to_string().as_str() {
                "." => String::new(),
                field => format!(" (at {field})"),
            };
            ApiError::invalid(format!(
                "the body must be a JSON object of this call's options{at}: {}",
                e.inner()
            ))
        })?;
    Ok(query.merge(parsed))
}

/// The gap between a stream's keep-alive comment lines that `keepAliveSeconds` asks for
/// ([`KEEP_ALIVE`] when absent), checked against its bounds.
pub fn keep_alive(seconds: Option<u32>) -> Result<Duration, ApiError> {
    match seconds {
        None => Ok(KEEP_ALIVE),
        Some(k) if (1..=MAX_KEEP_ALIVE_SECONDS).contains(&k) => Ok(Duration::from_secs(k.into())),
        Some(k) => Err(ApiError::invalid(format!(
            "keepAliveSeconds must be between 1 and {MAX_KEEP_ALIVE_SECONDS}, got {k}"
        ))),
    }
}

/// The lock of a request path, checked.
pub fn lock_id(namespace: &str, name: &str) -> Result<LockId, ApiError> {
    Ok(LockId::new(namespace, name)?)
}

/// The locks `with` names (none when absent), checked as names; the engine checks the set.
pub fn with_locks(namespace: &str, with: Option<Vec<String>>) -> Result<Vec<LockId>, ApiError> {
    (with.unwrap_or_default().iter())
        .map(|name| {
            LockId::new(namespace, name)
                .map_err(|e| ApiError::invalid(format!("with: {name:?} is not a lock name: {e}")))
        })
        .collect()
}

impl AcquireOptions {
    /// The wait as a duration, checked.
    pub fn wait(&self) -> Result<Duration, ApiError> {
        let w = self.wait_seconds.unwrap_or(30.0);
        if !(0.0..=MAX_WAIT_SECONDS).contains(&w) {
            return Err(ApiError::invalid(format!(
                "waitSeconds must be between 0 and {MAX_WAIT_SECONDS}, got {w}"
            )));
        }
        Ok(Duration::from_secs_f64(w))
    }

    /// Checks the per-hold overrides against the contract's bounds; `keepAliveSeconds` only
    /// for a hold bound to its connection (`streamed`).
    pub fn check(&self, streamed: bool) -> Result<(), ApiError> {
        match self.keep_alive_seconds {
            Some(_) if !streamed => {
                return Err(ApiError::invalid(
                    "keepAliveSeconds applies only to POST /v1/locks/{name}/hold (a hold bound to its connection)",
                ));
            }
            seconds => {
                keep_alive(seconds)?;
            }
        }
        if let Some(t) = self.ttl_seconds {
            TTL.check(t)?;
        }
        if let Some(h) = self.heartbeat_timeout_seconds {
            HEARTBEAT.check(h)?;
        }
        for (field, value) in [
            ("maxHoldSeconds", self.max_hold_seconds),
            (WARNING_FIELD, self.deadline_warning_seconds),
        ] {
            match value {
                Some(v) if !REQUEST_MAX_HOLD.contains(&v) => {
                    let (min, max) = REQUEST_MAX_HOLD.into_inner();
                    return Err(ApiError::invalid(format!(
                        "{field} must be between {min} and {max}, got {v}"
                    )));
                }
                _ => {}
            }
        }
        if let Some(c) = &self.container {
            check_container(c)?;
        }
        Ok(())
    }
}
