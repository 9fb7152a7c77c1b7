//! `GET /v1/locks/{name}/fence?token=N`: whether a fencing token is a current hold of a lock
//! (see [`Engine::fence`](crate::lock::Engine::fence) and docs/api.md).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::Uri;
use serde::Deserialize;
use tracing::{Instrument, info_span};

use super::error::ApiError;
use super::request::lock_id;
use super::state::AppState;
use crate::lock::FenceCheck;

/// The query of a fence check.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FenceQuery {
    /// The fencing token to check, as text so that a bad one gets a message of its own.
    token: Option<String>,
}

/// `GET /v1/locks/{name}/fence?token=N`.
pub async fn fence(
    State(st): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
) -> Result<Json<FenceCheck>, ApiError> {
    let lock = lock_id(&st.namespace, &name)?;
    let token = token(uri.query())?;
    let span = info_span!("fence", lock = %lock, token);
    Ok(Json(st.engine.fence(&lock, token).instrument(span).await?))
}

/// The token of a fence check's query string, or a 400 saying what to send.
fn token(query: Option<&str>) -> Result<i64, ApiError> {
    let parsed: FenceQuery = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| ApiError::invalid(format!("bad query string: {e}; send ?token=N")))?;
    let Some(raw) = parsed.token else {
        return Err(ApiError::invalid(
            "missing token: send ?token=N, N the fencingToken of the grant to check",
        ));
    };
    match raw.trim().parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ApiError::invalid(format!(
            "token must be a fencing token, a positive integer below 2^63 such as 42 (the \
             fencingToken of a grant); got {raw:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    /// The message of the 400 that `query` gets.
    async fn refused(query: Option<&str>) -> String {
        let resp = token(query).expect_err("refused").into_response();
        assert_eq!(resp.status(), 400, "{query:?}");
        let body = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "invalid_request", "{query:?}");
        body["message"].as_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn a_token_is_a_positive_integer_and_nothing_else() {
        assert_eq!(token(Some("token=42")).unwrap(), 42);
        assert_eq!(token(Some("token=9223372036854775807")).unwrap(), i64::MAX);
        for missing in [None, Some("")] {
            assert!(refused(missing).await.contains("?token=N"));
        }
        for bad in ["", "abc", "0", "-3", "1.5", "9223372036854775808"] {
            let message = refused(Some(&format!("token={bad}"))).await;
            assert!(message.contains(&format!("got \"{bad}\"")), "{message}");
        }
        assert!(refused(Some("token=4&holderId=x")).await.contains("holderId"));
    }
}
