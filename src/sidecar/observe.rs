//! `GET /v1/locks/{name}/watch`: a `text/event-stream` of who holds a lock, for any pod of the
//! namespace, holding it or not (see [`Engine::observe`](crate::lock::Engine::observe) and
//! docs/api.md). First the holders now (`holders`), then the holders again at each change of
//! them, a comment line every `keepAliveSeconds` as on `/hold`, and a last `deleted` when the
//! lock is deleted. The stream, and with it its etcd watch, ends as soon as the client closes
//! its connection ([`Peer::closed`]), not at the next keep-alive comment.

use axum::Extension;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt, stream};
use serde::Deserialize;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tracing::{Instrument, info_span};

use super::error::ApiError;
use super::peer::Peer;
use super::request::{MAX_KEEP_ALIVE_SECONDS, keep_alive, lock_id};
use super::state::AppState;
use crate::lock::Observed;

/// The query of a watch.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WatchQuery {
    /// Seconds between keep-alive comment lines, as text so that a bad one gets a message
    /// naming the field.
    keep_alive_seconds: Option<String>,
}

/// `GET /v1/locks/{name}/watch`. The lock's holders are read before the stream starts, so a
/// lock that is not declared, or an etcd that does not answer, gets an error as `GET` does.
pub async fn watch(
    State(st): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
    peer: Option<Extension<ConnectInfo<Peer>>>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let lock = lock_id(&st.namespace, &name)?;
    let interval = interval(uri.query())?;
    let span = info_span!("watch", lock = %lock);
    let (now, observer) = st.engine.observe(&lock).instrument(span.clone()).await?;
    let first = event(&Observed::Holders(now));
    // Each change is awaited in the span; the stream ends after the deletion.
    let changes = stream::unfold(Some(observer), move |observer| {
        let span = span.clone();
        async move {
            let mut observer = observer?;
            let news = observer.next().instrument(span).await;
            let more = matches!(news, Observed::Holders(_)).then_some(observer);
            Some((Ok(event(&news)), more))
        }
    });
    // Served without its connection known (a router called in-process): ends with the body.
    let closed: Pin<Box<dyn Future<Output = ()> + Send>> = match peer {
        Some(Extension(ConnectInfo(peer))) => Box::pin(peer.closed()),
        None => Box::pin(std::future::pending()),
    };
    let events = stream::once(async { Ok(first) })
        .chain(changes)
        .take_until(closed);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(interval)))
}

/// The server-sent event of `news`: `holders` or `deleted`, its data JSON.
fn event(news: &Observed) -> Event {
    let event = match news {
        Observed::Holders(now) => Event::default().event("holders").json_data(now),
        Observed::Deleted(gone) => Event::default().event("deleted").json_data(gone),
    };
    event.expect("holders serialize")
}

/// The keep-alive interval a watch's query string asks for, or a 400 naming what to fix.
fn interval(query: Option<&str>) -> Result<Duration, ApiError> {
    let parsed: WatchQuery = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| ApiError::invalid(format!("bad query string: {e}")))?;
    let seconds = (parsed.keep_alive_seconds)
        .map(|raw| {
            raw.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid(format!(
                    "keepAliveSeconds must be a whole number of seconds between 1 and \
                     {MAX_KEEP_ALIVE_SECONDS}, got {raw:?}"
                ))
            })
        })
        .transpose()?;
    keep_alive(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keep_alive_is_checked_as_holds_check_it() {
        assert_eq!(interval(None).unwrap(), Duration::from_secs(15));
        assert_eq!(
            interval(Some("keepAliveSeconds=300")).unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(
            interval(Some("keepAliveSeconds=1")).unwrap(),
            Duration::from_secs(1)
        );
        for bad in [
            "keepAliveSeconds=0",
            "keepAliveSeconds=301",
            "keepAliveSeconds=abc",
            "keepAlive=5",
        ] {
            assert_eq!(interval(Some(bad)).expect_err(bad).code(), "invalid_request");
        }
    }
}
