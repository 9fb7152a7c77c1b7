//! A hold's maximum hold time, kept by its monitor: the `deadline` event its warning's lead
//! time before the deadline, then the end of the hold at the deadline, as lost for
//! [`DEADLINE`] (the monitor ends it, and its key is removed as for any loss, which lets the
//! next waiter in). A sidecar that is gone by then cannot: the operator ends the hold a grace
//! after its deadline instead (`operator/reconcile/deadline.rs`).

use tokio::time::sleep_until;
use tracing::info;

use crate::lock::engine::Engine;
use crate::lock::engine::hold::Hold;
use crate::lock::messages::EventKind;
use crate::lock::txn::release_note::DEADLINE;

/// Warns `hold`'s subscribers when its deadline is near, and completes at the deadline;
/// never for a hold without a maximum hold time.
pub(super) async fn reached(engine: &Engine, hold: &Hold) -> &'static str {
    let Some(deadline) = hold.terms.max_hold else {
        return std::future::pending().await;
    };
    sleep_until(deadline.warn_at()).await;
    info!(lock = %hold.lock, holder = %hold.holder_id, token = hold.token(), "the hold's deadline is near");
    engine.publish(hold, EventKind::Deadline, None);
    sleep_until(deadline.at).await;
    DEADLINE
}
