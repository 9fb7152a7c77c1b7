//! `POST /v1/locks/{name}/hold`: a hold bound to the HTTP connection that asked for it.
//!
//! The request waits in the queue like an acquire and fails like one (409 `lock_held` at the
//! deadline, 4xx for bad input). Once granted, the answer is a `text/event-stream` whose first
//! event is the grant (`acquired`); a comment line every `keepAliveSeconds` keeps idle proxies
//! from closing it; a `deadline` event warns of the end of a hold with a maximum hold time; a
//! `lost` or `released` event ends it. The hold lasts exactly as long as the
//! client reads: when it closes the connection, or its process dies and the kernel closes the
//! socket, the stream is dropped and the sidecar releases the hold at once, with no heartbeat and
//! no TTL to wait out. `curl -N` is then a complete lock holder for a shell script.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt, stream};
use std::convert::Infallible;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use super::api::{Binding, acquire_counted};
use super::error::ApiError;
use super::request::{AcquireOptions, KEEP_ALIVE, keep_alive, lock_id, options};
use super::state::AppState;
use crate::lock::{Engine, EventKind, Grant, LockId};

/// The handler: acquires, then streams the hold until it ends or the client goes away.
pub async fn hold(
    State(st): State<AppState>,
    Path(name): Path<String>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let lock = lock_id(&st.namespace, &name)?;
    let opts: Result<AcquireOptions, ApiError> = options(&uri, body);
    // A bad keepAliveSeconds is refused with the other options, by the acquire.
    let interval = (opts.as_ref().ok())
        .and_then(|o| keep_alive(o.keep_alive_seconds).ok())
        .unwrap_or(KEEP_ALIVE);
    // Subscribed before the grant, so that a loss right after it cannot go unseen.
    let events = st.engine.subscribe(Some(lock.clone()));
    let grant = acquire_counted(&st, &name, opts, Binding::Connection).await?;
    let guard = Bound {
        engine: st.engine.clone(),
        lock,
        holder: grant.holder_id.clone(),
        token: grant.fencing_token,
        ended: false,
    };
    let first = Event::default().event("acquired").json_data(&grant).unwrap();
    let stream = stream::once(async { Ok(first) }).chain(ending(events, guard, grant));
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(interval)))
}

/// The hold's events after its grant: a `deadline` warning, then the one that ends it (`lost`
/// or `released`), after which the stream ends. If the engine's events stop first (the
/// sidecar is stopping, or this stream fell behind), the stream ends too, and with it the hold.
fn ending(
    events: tokio::sync::mpsc::Receiver<crate::lock::HoldEvent>,
    mut guard: Bound,
    grant: Grant,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let ours = ReceiverStream::new(events).filter(move |ev| {
        let ours = ev.holder_id == grant.holder_id && ev.fencing_token == grant.fencing_token;
        std::future::ready(ours && ev.kind != EventKind::Acquired)
    });
    // Ends right after the event that ends the hold, without waiting for another.
    let until_ended = stream::unfold((Box::pin(ours), false), |(mut ours, ended)| async move {
        if ended {
            return None;
        }
        let ev = ours.next().await?;
        let ends = ev.kind.ends();
        Some((ev, (ours, ends)))
    });
    until_ended.map(move |ev| {
        if ev.kind.ends() {
            guard.ended(); // the guard lives as long as this stream
        }
        Ok(Event::default().event(ev.kind.as_str()).json_data(&ev).unwrap())
    })
}

/// Releases the hold when the stream is dropped before the hold ended: the client went away.
struct Bound {
    engine: Engine,
    lock: LockId,
    holder: String,
    token: i64,
    /// The hold ended (its last event was sent): nothing to release.
    ended: bool,
}

impl Bound {
    /// The hold ended by itself: nothing to release when the stream goes.
    fn ended(&mut self) {
        self.ended = true;
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (engine, lock, holder, token) = (
            self.engine.clone(),
            self.lock.clone(),
            std::mem::take(&mut self.holder),
            self.token,
        );
        tokio::spawn(async move {
            debug!(lock = %lock, holder, token, "the connection of a hold bound to it closed; releasing");
            if let Err(e) = engine.release_token(&lock, &holder, token).await {
                warn!(lock = %lock, holder, token, error = %e, "a connection-bound hold ended otherwise");
            }
        });
    }
}
