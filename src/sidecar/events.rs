//! `GET /v1/locks/{name}/events`: a `text/event-stream` of this pod's `acquired`, `released`
//! and `lost` events for one lock.

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use std::convert::Infallible;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::AppState;
use super::error::ApiError;
use super::request::lock_id;

/// Streams events of one lock until the client goes away.
pub async fn events(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let lock = lock_id(&st.namespace, &name)?;
    let stream = BroadcastStream::new(st.engine.subscribe()).filter_map(move |ev| match ev {
        Ok(ev) if ev.lock == lock.name && ev.namespace == lock.namespace => {
            let kind = serde_json::to_value(ev.kind).ok()?.as_str()?.to_string();
            Some(Ok(Event::default().event(kind).json_data(&ev).ok()?))
        }
        Ok(_) => None,
        Err(BroadcastStreamRecvError::Lagged(n)) => Some(Ok(Event::default()
            .event("lagged")
            .data(format!("{{\"missed\":{n}}}")))),
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
