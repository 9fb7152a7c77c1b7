//! The sidecar's routes: which handler answers which path.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use super::state::AppState;
use super::{api, connection, events, fence, observe};

/// The health routes, served on --listen and on --health-listen.
pub(super) fn health_router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
}

/// The sidecar's routes on `state`.
pub fn router(state: AppState) -> Router {
    health_router()
        .route("/v1/locks", get(api::list))
        .route("/v1/locks/{name}", get(api::inspect))
        .route("/v1/locks/{name}/acquire", post(api::acquire))
        .route("/v1/locks/{name}/hold", post(connection::hold))
        .route("/v1/locks/{name}/release", post(api::release))
        .route("/v1/locks/{name}/heartbeat", post(api::heartbeat))
        .route("/v1/locks/{name}/events", get(events::events))
        .route("/v1/locks/{name}/fence", get(fence::fence))
        .route("/v1/locks/{name}/watch", get(observe::watch))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(1024 * 1024))
        .with_state(state)
}
