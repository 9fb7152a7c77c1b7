//! The mutating admission webhook: serves `/mutate` over TLS on every replica; the
//! `MutatingWebhookConfiguration` named `podlock` that points at it is kept current in
//! [`configuration`](super::configuration), its flags are in [`args`](super::args).
//!
//! TLS: see `certs` (supplied files or a self-made certificate, both reloaded when renewed).
//!
//! `failurePolicy: Ignore`: when the webhook is unreachable, pods are created without the
//! sidecar rather than not at all. A lock service must not be able to stop a cluster from
//! scheduling; a pod without a sidecar finds no lock API and its app can report that.

use axum::Json;
use axum::extract::State;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use super::configuration::{NAMESPACE_PATH, PATH};
use crate::operator::context::Context;
use crate::operator::inject::{self, SidecarTemplate};
use crate::operator::readiness::Readiness;

/// What `/mutate` needs.
pub struct Injector {
    /// The sidecar to inject.
    pub template: SidecarTemplate,
    /// The operator's context, for the namespace's etcd credentials.
    pub ctx: Arc<Context>,
    /// How long injection waits for a namespace's credentials ([`credentials_wait`]).
    pub credentials_wait: Duration,
}

/// How long injection waits for a namespace's credentials: 2 s, and well within the webhook's
/// timeout (`timeout_seconds`), past which the API server would create the pod without its
/// sidecar.
pub fn credentials_wait(timeout_seconds: i32) -> Duration {
    let timeout = Duration::from_secs(timeout_seconds.max(1) as u64);
    Duration::from_secs(2).min(timeout * 2 / 5)
}

/// Serves `/mutate` over TLS until the process ends, with the certificate in `config` (which
/// [`super::certs::keep_current`] renews); tells `readiness` once it listens.
pub async fn serve(
    listen: SocketAddr,
    config: axum_server::tls_rustls::RustlsConfig,
    injector: Injector,
    readiness: Arc<Readiness>,
) -> anyhow::Result<()> {
    let app = axum::Router::new()
        .route(PATH, axum::routing::post(mutate))
        .route(NAMESPACE_PATH, axum::routing::post(mutate_namespace))
        .with_state(Arc::new(injector));
    let listener = std::net::TcpListener::bind(listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen} for the webhook: {e}"))?;
    listener.set_nonblocking(true)?;
    readiness.webhook_listening();
    info!(%listen, "webhook serving");
    axum_server::from_tcp_rustls(listener, config)?
        .serve(app.into_make_service())
        .await?;
    Ok(())
}

/// `/mutate`: objects that podlock's annotations ask for.
async fn mutate(
    State(injector): State<Arc<Injector>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    admit(&injector, review, false).await
}

/// `/mutate/namespace`: the pods of a namespace labelled `podlock.io/inject=enabled` (the
/// webhook configuration sends only those here).
async fn mutate_namespace(
    State(injector): State<Arc<Injector>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    admit(&injector, review, true).await
}

/// The answer to `review`; `namespace_injects`: its namespace asks for the sidecar.
async fn admit(
    injector: &Injector,
    review: AdmissionReview<DynamicObject>,
    namespace_injects: bool,
) -> Json<AdmissionReview<DynamicObject>> {
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(req) => req,
        Err(e) => {
            return Json(AdmissionResponse::invalid(format!("not an admission request: {e}")).into_review());
        }
    };
    let resp = AdmissionResponse::from(&req);
    let Some(object) = &req.object else {
        return Json(resp.into_review());
    };
    let value = serde_json::to_value(object).expect("objects serialize");
    let namespace = req.namespace.as_deref().unwrap_or_default();
    let creating = req.operation == Operation::Create;
    let template = &injector.template;
    let resp = match inject::mutate(
        template,
        &req.kind.kind,
        creating,
        namespace,
        namespace_injects,
        &value,
    ) {
        Ok(mutation) => {
            if mutation.patch.is_some() {
                ensure_credentials(&injector.ctx, namespace, injector.credentials_wait).await;
            }
            count(&injector.ctx, &req, outcome(&mutation));
            answer(resp, &req, mutation)
        }
        Err(reason) => {
            count(&injector.ctx, &req, "denied");
            resp.deny(reason)
        }
    };
    Json(resp.into_review())
}

/// The admission response for `mutation` of the object `req` admits.
fn answer(
    mut resp: AdmissionResponse,
    req: &AdmissionRequest<DynamicObject>,
    mutation: inject::Mutation,
) -> AdmissionResponse {
    let (kind, name) = (&req.kind.kind, req.name.as_str());
    let namespace = req.namespace.as_deref().unwrap_or_default();
    if let Some(warning) = mutation.warning {
        info!(kind, namespace, name, warning, "not injecting");
        resp.warnings = Some(vec![warning]);
    }
    let Some(patch) = mutation.patch else {
        return resp;
    };
    info!(kind, namespace, name, "injecting: {}", describe(kind));
    resp.with_patch(patch)
        .unwrap_or_else(|e| AdmissionResponse::invalid(e.to_string()))
}

/// `podlock_webhook_admissions_total`: with `matchConditions`, only objects that carry
/// podlock's annotations are sent here, so this counts those alone.
fn count(ctx: &Context, req: &AdmissionRequest<DynamicObject>, outcome: &str) {
    let counter = &ctx.metrics.admissions;
    counter
        .with_label_values(&[req.kind.kind.as_str(), outcome])
        .inc();
}

/// The outcome label of `mutation`.
fn outcome(mutation: &inject::Mutation) -> &'static str {
    match (&mutation.patch, &mutation.warning) {
        (Some(_), _) => "changed",
        (None, Some(_)) => "warned",
        (None, None) => "unchanged",
    }
}

/// What the webhook does to an object of `kind`.
fn describe(kind: &str) -> &'static str {
    match kind {
        "Pod" => "adding the podlock sidecar",
        _ => "copying the podlock annotations into the pod template",
    }
}

/// With namespace isolation, makes sure the namespace has its etcd credentials Secret before
/// the API server stores the object being injected: its pods' sidecars read that Secret when
/// they start, through an optional reference, so a pod started before it exists would run
/// without credentials. Injection goes ahead regardless (a lock service must not stop pods).
async fn ensure_credentials(ctx: &Context, namespace: &str, wait: Duration) {
    let ensured = ctx.isolation.ensure_secret(&ctx.client, &ctx.store, namespace);
    let failure = match tokio::time::timeout(wait, ensured).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("{e:#}"),
        Err(_) => format!("no answer within {wait:?}"),
    };
    warn!(
        namespace,
        error = failure,
        "could not give the namespace its etcd credentials before injecting; its sidecars may start without them"
    );
}
