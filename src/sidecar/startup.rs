//! Start-up without etcd: the sidecar listens before it reaches etcd, so that an etcd outage
//! (or a wrong password) never keeps a pod from starting. Until etcd is reached, `/healthz`
//! answers and everything else is 503 `backend_unavailable`; each failed attempt is logged
//! with its cause.

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tower::ServiceExt;
use tracing::{info, warn};

use super::args::SidecarArgs;
use super::error::ApiError;
use crate::lock::Engine;

/// The longest pause between two attempts to reach etcd.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// What exists once etcd was reached: the engine and the routes that use it.
struct Running {
    engine: Engine,
    api: Router,
    health: Router,
}

/// The sidecar's state, set once: empty while it connects.
#[derive(Clone, Default)]
pub(super) struct Started(Arc<OnceLock<Running>>);

impl Started {
    /// The engine, once connected.
    pub fn engine(&self) -> Option<&Engine> {
        self.0.get().map(|r| &r.engine)
    }

    /// Connects (retrying until it succeeds), then serves the full API.
    pub async fn connect(self, args: SidecarArgs) {
        let mut pause = Duration::from_millis(200);
        let (engine, state) = loop {
            match super::state::start(&args).await {
                Ok(started) => break started,
                Err(e) => warn!(
                    error = format!("{e:#}"),
                    retry_in = ?pause,
                    "cannot reach etcd yet; the API answers 503 until it can"
                ),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        };
        let running = Running {
            engine,
            api: super::routes::router(state.clone()),
            health: super::routes::health_router().with_state(state),
        };
        if self.0.set(running).is_ok() {
            info!("connected to etcd; the API serves");
        }
    }

    /// The API's router: the full API once connected, [`starting`] before.
    pub fn api(&self) -> Router {
        self.front(|r| &r.api)
    }

    /// The health listener's router, likewise.
    pub fn health(&self) -> Router {
        self.front(|r| &r.health)
    }

    fn front(&self, pick: fn(&Running) -> &Router) -> Router {
        let started = self.clone();
        Router::new().fallback(move |req: Request| async move {
            match started.0.get() {
                Some(running) => pick(running).clone().oneshot(req).await.into_response(),
                None => starting(req.uri().path()),
            }
        })
    }
}

/// The answer to a request that arrives before etcd was reached.
fn starting(path: &str) -> Response {
    match path {
        "/healthz" => axum::Json(serde_json::json!({ "status": "ok" })).into_response(),
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend_unavailable",
            "the sidecar has not reached etcd yet (its log says why); retry shortly",
        )
        .into_response(),
    }
}
