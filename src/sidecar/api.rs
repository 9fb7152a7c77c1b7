//! The HTTP handlers of the sidecar API (see `docs/api.md`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::time::Instant;
use tracing::{Instrument, info_span};

use super::error::ApiError;
use super::request::{AcquireOptions, HolderOptions, lock_id, options, with_locks};
use super::state::AppState;
use crate::critical_path::{self, Point};
use crate::lock::rfc3339;
use crate::lock::{AcquireRequest, Grant, Token, unique_holder_id};
use crate::metrics::set_counter;

type ApiResult<T> = Result<T, ApiError>;

/// `POST /v1/locks/{name}/acquire`.
pub async fn acquire(
    State(st): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Grant>> {
    acquire_counted(&st, &name, options(&uri, body), Binding::Request)
        .await
        .map(Json)
}

/// What a hold is bound to besides its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Nothing: it lasts until released, lost, or its heartbeat window passes
    /// (`POST .../acquire`).
    Request,
    /// The HTTP connection that asked for it (`POST .../hold`, see [`super::connection`]).
    Connection,
}

/// Acquires as `opts` ask, and counts the outcome in the acquire metrics.
pub async fn acquire_counted(
    st: &AppState,
    name: &str,
    opts: ApiResult<AcquireOptions>,
    binding: Binding,
) -> ApiResult<Grant> {
    let started = Instant::now();
    let result = try_acquire(st, name, opts, binding).await;
    // Only valid names become label values, so bad requests cannot blow up the series count.
    let name = if lock_id(&st.namespace, name).is_ok() {
        name
    } else {
        "(invalid)"
    };
    let outcome = match &result {
        Ok(_) => "acquired",
        Err(e) => e.code(),
    };
    if let Ok(grant) = &result {
        let token = Token::from_raw(grant.fencing_token).revision();
        critical_path::mark(Point::GrantAnswered, token, 0);
        st.metrics
            .acquire_wait
            .with_label_values(&[name])
            .observe(started.elapsed().as_secs_f64());
        if grant.handed_on {
            st.metrics.handoffs.with_label_values(&[name]).inc();
        }
    }
    st.metrics.acquire_total.with_label_values(&[name, outcome]).inc();
    // Every lock this sidecar was asked for reports its lost holds from the first scrape on,
    // 0 until one is lost, so that alerts on it see a series rather than nothing.
    for reason in super::lost_reason::alerting() {
        st.metrics.locks_lost.with_label_values(&[name, reason]);
    }
    st.metrics.handoffs.with_label_values(&[name]);
    result
}

async fn try_acquire(
    st: &AppState,
    name: &str,
    opts: ApiResult<AcquireOptions>,
    binding: Binding,
) -> ApiResult<Grant> {
    let lock = lock_id(&st.namespace, name)?;
    let opts = opts?;
    opts.check(binding == Binding::Connection)?;
    let heartbeat = match binding {
        Binding::Request => opts.heartbeat_timeout_seconds.or(st.default_heartbeat),
        // The open connection is the hold's heartbeat; a window asked for explicitly still applies.
        Binding::Connection => opts.heartbeat_timeout_seconds.or(Some(0)),
    };
    // A connection's hold is its own: without a holderId it gets one no other request has.
    let wait = opts.wait()?;
    let holder_id = match (opts.holder_id, binding) {
        (Some(id), _) => id,
        (None, Binding::Request) => st.default_holder.clone(),
        (None, Binding::Connection) => unique_holder_id(&st.default_holder),
    };
    let req = AcquireRequest {
        wait,
        holder_id,
        connection_bound: binding == Binding::Connection,
        ttl_seconds: opts.ttl_seconds,
        heartbeat_timeout_seconds: heartbeat,
        max_hold_seconds: opts.max_hold_seconds,
        deadline_warning_seconds: opts.deadline_warning_seconds,
        container: opts.container,
        mode: opts.mode.unwrap_or_default(),
        permits: opts.permits.unwrap_or(1),
        with: with_locks(&st.namespace, opts.with)?,
        lock,
    };
    let span = info_span!("acquire", lock = %req.lock, holder = %req.holder_id);
    Ok(st.engine.acquire(req).instrument(span).await?)
}

/// `POST /v1/locks/{name}/release`.
pub async fn release(
    State(st): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    critical_path::mark(Point::ReleaseRequest, 0, 0);
    let (lock, holder) = lock_and_holder(&st, &name, &uri, body)?;
    let span = info_span!("release", lock = %lock, holder = %holder);
    st.engine.release(&lock, &holder).instrument(span).await?;
    Ok(Json(json!({ "released": true })))
}

/// `POST /v1/locks/{name}/heartbeat`.
pub async fn heartbeat(
    State(st): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Value>> {
    let (lock, holder) = lock_and_holder(&st, &name, &uri, body)?;
    let span = info_span!("heartbeat", lock = %lock, holder = %holder);
    let expires = st.engine.heartbeat(&lock, &holder).instrument(span).await?;
    Ok(Json(json!({ "expiresAt": rfc3339(expires) })))
}

/// The lock and holder id a release or heartbeat names.
fn lock_and_holder(
    st: &AppState,
    name: &str,
    uri: &Uri,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(crate::lock::LockId, String)> {
    let lock = lock_id(&st.namespace, name)?;
    let opts: HolderOptions = options(uri, body)?;
    Ok((lock, opts.holder_id.unwrap_or_else(|| st.default_holder.clone())))
}

/// `GET /v1/locks/{name}`.
pub async fn inspect(State(st): State<AppState>, Path(name): Path<String>) -> ApiResult<Response> {
    let lock = lock_id(&st.namespace, &name)?;
    Ok(Json(st.engine.inspect(&lock).await?).into_response())
}

/// `GET /v1/locks`: the locks this sidecar holds or waits for.
pub async fn list(State(st): State<AppState>) -> Json<Value> {
    Json(json!({ "namespace": st.namespace, "locks": st.engine.local() }))
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: etcd answers.
pub async fn readyz(State(st): State<AppState>) -> Response {
    if st.engine.ready(std::time::Duration::from_secs(1)).await {
        Json(json!({ "status": "ready" })).into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend_unavailable",
            "etcd did not answer within 1 s",
        )
        .into_response()
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(st): State<AppState>) -> Response {
    let m = &st.metrics;
    m.held_locks.set(st.engine.held_count() as i64);
    set_counter(&m.keepalive_failures, st.engine.keepalive_failures());
    let stats = st.engine.stats();
    let counted = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    set_counter(&m.etcd_requests, counted(&stats.requests));
    set_counter(&m.etcd_requests_resent, counted(&stats.resent));
    set_counter(&m.watch_events, counted(&stats.watch_events));
    set_counter(&m.etcd_watches, counted(&stats.watches));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.render()).into_response()
}

/// Any other path.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no endpoint at {}; see /v1/locks/{{name}}/acquire, release, heartbeat, events, fence, watch",
            uri.path()
        ),
    )
}

/// A known path with the wrong method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "wrong method: acquire, release and heartbeat take POST; reads take GET",
    )
}
