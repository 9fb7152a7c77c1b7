//! The mutating admission webhook: serves `/mutate` over TLS on every replica and keeps the
//! `MutatingWebhookConfiguration` named `podlock` pointing at it with a current `caBundle`.
//!
//! TLS: see `certs` (supplied files or a self-made certificate, both reloaded when renewed).
//!
//! `failurePolicy: Ignore`: when the webhook is unreachable, pods are created without the
//! sidecar rather than not at all. A lock service must not be able to stop a cluster from
//! scheduling; a pod without a sidecar finds no lock API and its app can report that.

use axum::Json;
use axum::extract::State;
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use kube::api::{Api, Patch};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use super::context::Context;
use super::inject::{self, SidecarTemplate};
use super::readiness::Readiness;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};

/// Webhook flags of `podlock operator`.
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Address for the webhook's HTTPS server (path /mutate).
    #[arg(long, env = "PODLOCK_WEBHOOK_LISTEN", default_value = "0.0.0.0:9443")]
    pub webhook_listen: SocketAddr,
    /// Service (in the operator's namespace) through which the API server reaches the webhook.
    #[arg(long, env = "PODLOCK_WEBHOOK_SERVICE", default_value = "podlock-webhook")]
    pub webhook_service: String,
    /// Register this URL (https://HOST:PORT/mutate) instead of the Service, for an operator
    /// running outside the cluster.
    #[arg(long, env = "PODLOCK_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// Name of the MutatingWebhookConfiguration this operator owns.
    #[arg(long, env = "PODLOCK_WEBHOOK_CONFIGURATION", default_value = "podlock")]
    pub webhook_configuration: String,
    /// Secret (in the operator's namespace) that keeps the self-made serving certificate.
    #[arg(
        long,
        env = "PODLOCK_WEBHOOK_TLS_SECRET",
        default_value = "podlock-webhook-tls"
    )]
    pub webhook_tls_secret: String,
    /// Serving certificate (PEM) instead of the self-made one.
    #[arg(long, env = "PODLOCK_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key (PEM) of --tls-cert-file.
    #[arg(long, env = "PODLOCK_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// CA (PEM) that signed --tls-cert-file, written into the webhook's caBundle.
    #[arg(long, env = "PODLOCK_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// How often the serving certificate is read again (files renewed in place, e.g. by
    /// cert-manager, or the self-made one's Secret), in seconds.
    #[arg(long, env = "PODLOCK_TLS_RELOAD_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub tls_reload_seconds: u64,
    /// Image of the injected sidecar.
    #[arg(long, env = "PODLOCK_SIDECAR_IMAGE", default_value = concat!("ghcr.io/podlock/podlock:", env!("CARGO_PKG_VERSION")))]
    pub sidecar_image: String,
    /// etcd endpoints given to injected sidecars (default: the operator's own).
    #[arg(long, env = "PODLOCK_SIDECAR_ETCD_ENDPOINTS")]
    pub sidecar_etcd_endpoints: Option<String>,
    /// The installation's name (the chart passes its release name): injected pods are labelled
    /// `podlock.io/instance=<this>`, which the bundled etcd's NetworkPolicy admits.
    #[arg(long, env = "PODLOCK_INSTANCE", default_value = "podlock", value_parser = label_value)]
    pub instance: String,
}

/// A Kubernetes label value: at most 63 characters, alphanumerics and `-_.` inside.
fn label_value(value: &str) -> Result<String, String> {
    let inner = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = value.len() <= 63
        && value.chars().all(inner)
        && ends(value.chars().next())
        && ends(value.chars().last());
    ok.then(|| value.to_string()).ok_or_else(|| {
        format!("{value:?} is not a label value (at most 63 characters: letters, digits and -_. inside)")
    })
}

/// Creates or updates the MutatingWebhookConfiguration (server-side apply) every minute, so
/// that a deleted or edited configuration comes back, and at once when the CA in `ca` changes
/// (a rotated certificate), so that `caBundle` follows it.
pub async fn keep_configuration(
    client: kube::Client,
    args: WebhookArgs,
    namespace: String,
    watch_namespace: Option<String>,
    mut ca: tokio::sync::watch::Receiver<Option<String>>,
    owner: Option<OwnerReference>,
) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let params = super::owner::server_side_apply();
    loop {
        let bundle = ca.borrow_and_update().clone();
        let config = configuration(
            &args,
            &namespace,
            watch_namespace.as_deref(),
            bundle,
            owner.clone(),
        );
        if let Err(e) = api
            .patch(&args.webhook_configuration, &params, &Patch::Apply(&config))
            .await
        {
            warn!(error = %e, "could not apply the MutatingWebhookConfiguration; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            changed = ca.changed() => if changed.is_err() { return },
        }
    }
}

/// The webhook's configuration: reached through `--webhook-url`, else the Service in
/// `namespace`; called only for objects that carry podlock's annotations (`matchConditions`),
/// never for the operator's own. An operator limited to one namespace injects only there;
/// otherwise every namespace but `kube-system`.
fn configuration(
    args: &WebhookArgs,
    namespace: &str,
    watch_namespace: Option<&str>,
    ca: Option<String>,
    owner: Option<OwnerReference>,
) -> MutatingWebhookConfiguration {
    let namespaces = match watch_namespace {
        Some(ns) => LabelSelector {
            match_labels: Some(BTreeMap::from([(NAMESPACE_NAME.into(), ns.into())])),
            ..Default::default()
        },
        None => not_in(NAMESPACE_NAME, "kube-system"),
    };
    let webhook = |name: &str, rules, condition: &str| MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some("Ignore".into()),
        timeout_seconds: Some(5),
        client_config: client_config(args, namespace, ca.clone()),
        rules: Some(rules),
        match_conditions: Some(vec![MatchCondition {
            name: "podlock-annotated".into(),
            expression: condition.into(),
        }]),
        namespace_selector: Some(namespaces.clone()),
        object_selector: Some(not_in(inject::OPERATOR_LABEL.0, inject::OPERATOR_LABEL.1)),
        // Called again after later webhooks (a mesh's injector) changed the pod.
        reinvocation_policy: Some("IfNeeded".into()),
        ..Default::default()
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(args.webhook_configuration.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".into(),
                "podlock".into(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        webhooks: Some(vec![
            webhook("pods.inject.podlock.io", pod_rules(), POD_ASKS),
            webhook("workloads.inject.podlock.io", workload_rules(), WORKLOAD_ASKS),
        ]),
    }
}

/// A selector of objects whose label `key` is not `value` (or is absent).
fn not_in(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: "NotIn".into(),
            values: Some(vec![value.into()]),
        }]),
        ..Default::default()
    }
}

/// A pod that asks for the sidecar (CEL, evaluated by the API server before calling us).
const POD_ASKS: &str = "has(object.metadata.annotations) && \
    'podlock.io/inject' in object.metadata.annotations && \
    object.metadata.annotations['podlock.io/inject'] == 'true'";

/// A workload annotated for podlock, or whose template holds copies to remove.
const WORKLOAD_ASKS: &str = "(has(object.metadata.annotations) && \
    'podlock.io/inject' in object.metadata.annotations) || \
    (has(object.spec.template.metadata) && has(object.spec.template.metadata.annotations) && \
    'podlock.io/inject-stamp' in object.spec.template.metadata.annotations)";

/// How the API server reaches the webhook: `--webhook-url`, else the Service in `namespace`.
fn client_config(args: &WebhookArgs, namespace: &str, ca: Option<String>) -> WebhookClientConfig {
    let service = ServiceReference {
        name: args.webhook_service.clone(),
        namespace: namespace.into(),
        path: Some("/mutate".into()),
        port: Some(443),
    };
    WebhookClientConfig {
        url: args.webhook_url.clone(),
        service: args.webhook_url.is_none().then_some(service),
        ca_bundle: ca.map(|ca| k8s_openapi::ByteString(ca.into_bytes())),
    }
}

fn rule(operations: &[&str], group: &str, resources: &[&str]) -> RuleWithOperations {
    let strings = |v: &[&str]| Some(v.iter().map(|r| r.to_string()).collect());
    RuleWithOperations {
        operations: strings(operations),
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec!["v1".into()]),
        resources: strings(resources),
        ..Default::default()
    }
}

/// Pods are injected when created, never updated.
fn pod_rules() -> Vec<RuleWithOperations> {
    vec![rule(&["CREATE"], "", &["pods"])]
}

/// Workloads get their annotations copied into their template; a Job's template is immutable.
fn workload_rules() -> Vec<RuleWithOperations> {
    vec![
        rule(
            &["CREATE", "UPDATE"],
            "apps",
            &["deployments", "statefulsets", "daemonsets"],
        ),
        rule(&["CREATE"], "batch", &["jobs"]),
    ]
}

/// The label every namespace carries with its own name.
const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// What `/mutate` needs.
pub struct Injector {
    /// The sidecar to inject.
    pub template: SidecarTemplate,
    /// The operator's context, for the namespace's etcd credentials.
    pub ctx: Arc<Context>,
}

/// How long injection waits for a namespace's credentials: well within the webhook's 5 s
/// timeout, past which the API server would create the pod without its sidecar.
const CREDENTIALS_WAIT: Duration = Duration::from_secs(2);

/// Serves `/mutate` over TLS until the process ends, with the certificate in `config` (which
/// [`super::certs::keep_current`] renews); tells `readiness` once it listens.
pub async fn serve(
    listen: SocketAddr,
    config: axum_server::tls_rustls::RustlsConfig,
    injector: Injector,
    readiness: Arc<Readiness>,
) -> anyhow::Result<()> {
    let app = axum::Router::new()
        .route("/mutate", axum::routing::post(mutate))
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

async fn mutate(
    State(injector): State<Arc<Injector>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
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
    let resp = match inject::mutate(&injector.template, &req.kind.kind, creating, namespace, &value) {
        Ok(mutation) => {
            if mutation.patch.is_some() {
                ensure_credentials(&injector.ctx, namespace).await;
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
async fn ensure_credentials(ctx: &Context, namespace: &str) {
    let ensured = ctx.isolation.ensure_secret(&ctx.client, &ctx.store, namespace);
    let failure = match tokio::time::timeout(CREDENTIALS_WAIT, ensured).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("{e:#}"),
        Err(_) => format!("no answer within {CREDENTIALS_WAIT:?}"),
    };
    warn!(
        namespace,
        error = failure,
        "could not give the namespace its etcd credentials before injecting; its sidecars may start without them"
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_instance_must_be_a_label_value() {
        for good in ["podlock", "team-a.locks_2", "a"] {
            assert_eq!(super::label_value(good).as_deref(), Ok(good));
        }
        for bad in ["", "-podlock", "podlock-", "pod lock", "a/b", &"x".repeat(64)] {
            let err = super::label_value(bad).unwrap_err();
            assert!(err.contains("label value"), "{bad:?}: {err}");
        }
    }
}
