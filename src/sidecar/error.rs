//! The one place where errors become HTTP responses: `{"error": code, "message": text}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::lock::{InvalidName, LockError};

/// An error response of the sidecar API.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Option<(&'static str, Value)>,
}

impl ApiError {
    /// A 400 `invalid_request` saying what to fix.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// An error with any status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: None,
        }
    }

    /// The machine-readable code, for metrics.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl From<InvalidName> for ApiError {
    fn from(e: InvalidName) -> Self {
        ApiError::invalid(e.to_string())
    }
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        let message = e.to_string();
        let unavailable =
            |message| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "backend_unavailable", message);
        match e {
            LockError::Invalid(_) | LockError::Rejected(_) => ApiError::invalid(message),
            LockError::AboveMaxHold { limit, .. } => ApiError {
                extra: Some(("maxHoldSeconds", json!(limit))),
                ..ApiError::invalid(message)
            },
            LockError::AbovePermits { limit, .. } => ApiError {
                extra: Some(("maxHolders", json!(limit))),
                ..ApiError::invalid(message)
            },
            LockError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, "lock_not_found", message),
            LockError::Held { holders, .. } => ApiError {
                extra: Some(("holders", json!(holders))),
                ..ApiError::new(StatusCode::CONFLICT, "lock_held", message)
            },
            LockError::AlreadyWaiting { .. } => {
                ApiError::new(StatusCode::CONFLICT, "already_waiting", message)
            }
            LockError::HolderInUse { .. } => ApiError::new(StatusCode::CONFLICT, "holder_in_use", message),
            LockError::ModeConflict { .. } => ApiError::new(StatusCode::CONFLICT, "mode_conflict", message),
            LockError::NotHolder { .. } => ApiError::new(StatusCode::CONFLICT, "not_holder", message),
            LockError::Lost { .. } => ApiError::new(StatusCode::GONE, "lock_lost", message),
            LockError::Forbidden(_) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", message),
            LockError::Corrupt(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data", message)
            }
            // etcd down or failing over, a lease or watch that ended, a placement that raced,
            // etcd full until its administrator frees it: each may pass.
            LockError::Unavailable(_) | LockError::LeaseNotFound(_) => unavailable(message),
            // etcd's revisions have outgrown the fencing token: no grant until the locks move
            // to a new etcd (the message says so).
            LockError::Token { .. } => unavailable(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.code, "message": self.message });
        if let Some((k, v)) = self.extra {
            body[k] = v;
        }
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Unavailable;

    #[test]
    fn a_request_etcd_rejects_is_a_400_and_an_outage_a_503() {
        let status = |e: LockError| ApiError::from(e).into_response().status();
        assert_eq!(status(LockError::Rejected("request is too large".into())), 400);
        let full = Unavailable::EtcdFull("database space exceeded".into());
        assert_eq!(status(full.into()), 503);
        let timeout = Unavailable::Timeout(std::time::Duration::from_secs(5));
        assert_eq!(status(timeout.into()), 503);
    }
}
