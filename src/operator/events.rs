//! Kubernetes Events the operator records: one function, so that every caller publishes them
//! alike and a failure is only logged (an Event is a courtesy, never worth a reconciliation).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

/// Records a Kubernetes Event of `type_` on `object` (a failure is logged only).
pub async fn publish(
    recorder: &Recorder,
    object: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, object).await {
        warn!(object = ?object.name, error = %e, "could not publish a Kubernetes Event");
    }
}
