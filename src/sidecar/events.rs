//! `GET /v1/locks/{name}/events`: a `text/event-stream` of this pod's `acquired`, `released`,
//! `lost` and `deadline` events for one lock.

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt, stream};
use std::convert::Infallible;
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::request::lock_id;
use super::state::AppState;

/// Streams events of one lock until the client goes away or the sidecar stops. If the client
/// reads too slowly the engine drops it: the stream then sends a last `lagged` event and ends,
/// and the client must treat its holds as lost (it may have missed a `lost`).
pub async fn events(
    State(st): State<AppState>,
    Path(name): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let lock = lock_id(&st.namespace, &name)?;
    let events = ReceiverStream::new(st.engine.subscribe(Some(lock))).filter_map(|ev| async move {
        Some(Ok(Event::default()
            .event(ev.kind.as_str())
            .json_data(&ev)
            .ok()?))
    });
    let lagged = Event::default().event("lagged").data(
        r#"{"message":"this stream ends (it fell behind, or the sidecar is stopping): treat every hold of this lock as lost unless GET /v1/locks still lists it"}"#,
    );
    Ok(Sse::new(events.chain(stream::once(async { Ok(lagged) }))).keep_alive(KeepAlive::default()))
}
