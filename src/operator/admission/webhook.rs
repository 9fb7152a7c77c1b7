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

use crate::operator::context::Context;
use crate::operator::inject::{self, SidecarTemplate};
use crate::operator::readiness::Readiness;
use k8s_openapi::api::core::v1::ResourceRequirements;
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
    /// How long the API server waits for the webhook's answer, in seconds, before it creates
    /// the object unchanged (`failurePolicy: Ignore`).
    #[arg(long, env = "PODLOCK_WEBHOOK_TIMEOUT_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(i32).range(1..=30))]
    pub webhook_timeout_seconds: i32,
    /// A label selector (JSON: matchLabels, matchExpressions) that namespaces must match, too,
    /// to be injected, e.g. {"matchExpressions":[{"key":"team","operator":"In","values":["a"]}]}.
    #[arg(long, env = "PODLOCK_WEBHOOK_NAMESPACE_SELECTOR", value_parser = namespace_selector)]
    pub webhook_namespace_selector: Option<LabelSelector>,
    /// Image of the injected sidecar.
    #[arg(long, env = "PODLOCK_SIDECAR_IMAGE", default_value = concat!("ghcr.io/podlock/podlock:", env!("CARGO_PKG_VERSION")))]
    pub sidecar_image: String,
    /// etcd endpoints given to injected sidecars (default: the operator's own).
    #[arg(long, env = "PODLOCK_SIDECAR_ETCD_ENDPOINTS")]
    pub sidecar_etcd_endpoints: Option<String>,
    /// The injected sidecar's requests and limits, JSON: {"requests": {"cpu": "10m", "memory":
    /// "16Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}} (these are the default).
    #[arg(long, env = "PODLOCK_SIDECAR_RESOURCES", value_parser = inject::flags::resources)]
    pub sidecar_resources: Option<ResourceRequirements>,
    /// What the injected sidecar logs (its PODLOCK_LOG): a level, e.g. debug, or a filter, e.g.
    /// info,podlock=debug (default: the sidecar's own, info).
    #[arg(long, env = "PODLOCK_SIDECAR_LOG_LEVEL", value_parser = inject::flags::log_level)]
    pub sidecar_log_level: Option<String>,
    /// The installation's name (the chart passes its release name): injected pods are labelled
    /// `podlock.io/instance=<this>`, which the bundled etcd's NetworkPolicy admits.
    #[arg(long, env = "PODLOCK_INSTANCE", default_value = "podlock", value_parser = label_value)]
    pub instance: String,
}

/// `--webhook-namespace-selector`: a label selector as JSON, with only matchLabels and
/// matchExpressions (operators In, NotIn with values, Exists, DoesNotExist without).
fn namespace_selector(text: &str) -> Result<LabelSelector, String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("{text:?} is not JSON ({e}); e.g. {{\"matchLabels\": {{\"team\": \"a\"}}}}"))?;
    let keys = value
        .as_object()
        .ok_or_else(|| format!("{text:?} is not a JSON object"))?;
    if let Some(key) = keys
        .keys()
        .find(|k| !["matchLabels", "matchExpressions"].contains(&k.as_str()))
    {
        return Err(format!(
            "unknown key {key:?}: only matchLabels and matchExpressions"
        ));
    }
    let selector: LabelSelector =
        serde_json::from_value(value).map_err(|e| format!("not a label selector: {e}"))?;
    for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
        let values = e.values.as_ref().is_some_and(|v| !v.is_empty());
        let ok = match e.operator.as_str() {
            "In" | "NotIn" => values,
            "Exists" | "DoesNotExist" => !values,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "matchExpressions[{i}] (key {:?}, operator {:?}): the operator must be In or NotIn with values, or Exists or DoesNotExist without",
                e.key, e.operator
            ));
        }
    }
    Ok(selector)
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
    let params = crate::operator::owner::server_side_apply();
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
/// and for the pods of namespaces labelled `podlock.io/inject=enabled` but those annotated
/// `"false"` (at their own path, [`NAMESPACE_PATH`]); never for the operator's own. An
/// operator limited to one namespace injects only there; otherwise every namespace but
/// `kube-system`; and only in namespaces that `--webhook-namespace-selector` selects.
fn configuration(
    args: &WebhookArgs,
    namespace: &str,
    watch_namespace: Option<&str>,
    ca: Option<String>,
    owner: Option<OwnerReference>,
) -> MutatingWebhookConfiguration {
    let (namespaces, annotated_pods, injecting) = namespace_selectors(args, watch_namespace);
    let hook = |path: &str, spec| webhook(args, client_config(args, namespace, ca.clone(), path), spec);
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(args.webhook_configuration.clone()),
            labels: labelled("app.kubernetes.io/part-of", "podlock").match_labels,
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        webhooks: Some(vec![
            hook(
                PATH,
                ("pods.inject.podlock.io", pod_rules(), POD_ASKS, annotated_pods),
            ),
            hook(
                PATH,
                (
                    "workloads.inject.podlock.io",
                    workload_rules(),
                    WORKLOAD_ASKS,
                    namespaces,
                ),
            ),
            hook(
                NAMESPACE_PATH,
                (
                    "namespace.inject.podlock.io",
                    pod_rules(),
                    POD_STAYS_IN,
                    injecting,
                ),
            ),
        ]),
    }
}

/// One of the webhooks: its name, rules, match condition and namespaces, reached at `client`.
fn webhook(
    args: &WebhookArgs,
    client: WebhookClientConfig,
    (name, rules, condition, namespaces): (&str, Vec<RuleWithOperations>, &str, LabelSelector),
) -> MutatingWebhook {
    MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some("Ignore".into()),
        timeout_seconds: Some(args.webhook_timeout_seconds),
        client_config: client,
        rules: Some(rules),
        match_conditions: Some(vec![MatchCondition {
            name: "podlock-annotated".into(),
            expression: condition.into(),
        }]),
        namespace_selector: Some(namespaces),
        object_selector: Some(not_in(inject::OPERATOR_LABEL.0, inject::OPERATOR_LABEL.1)),
        // Called again after later webhooks (a mesh's injector) changed the pod.
        reinvocation_policy: Some("IfNeeded".into()),
        ..Default::default()
    }
}

/// The namespaces the webhooks serve: all of them (for workloads), those whose annotated pods
/// go to [`PATH`], and those labelled to inject every pod, whose pods go to [`NAMESPACE_PATH`]
/// only, so that none is sent twice.
fn namespace_selectors(
    args: &WebhookArgs,
    watch_namespace: Option<&str>,
) -> (LabelSelector, LabelSelector, LabelSelector) {
    let namespaces = match watch_namespace {
        Some(ns) => labelled(NAMESPACE_NAME, ns),
        None => not_in(NAMESPACE_NAME, "kube-system"),
    };
    let namespaces = both(namespaces, args.webhook_namespace_selector.clone());
    let (key, enabled) = (inject::NAMESPACE_LABEL, inject::NAMESPACE_ENABLED);
    let annotated_pods = both(namespaces.clone(), Some(not_in(key, enabled)));
    let injecting = both(namespaces.clone(), Some(labelled(key, enabled)));
    (namespaces, annotated_pods, injecting)
}

/// A selector of objects whose label `key` is `value`.
fn labelled(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.into(), value.into())])),
        ..Default::default()
    }
}

/// Objects that both selectors select (`extra`: none, all).
fn both(mut selector: LabelSelector, extra: Option<LabelSelector>) -> LabelSelector {
    let Some(extra) = extra else { return selector };
    if let Some(labels) = extra.match_labels {
        selector.match_labels.get_or_insert_default().extend(labels);
    }
    if let Some(expressions) = extra.match_expressions {
        selector
            .match_expressions
            .get_or_insert_default()
            .extend(expressions);
    }
    selector
}

/// The webhook's path for objects the annotation asks for.
const PATH: &str = "/mutate";
/// The webhook's path for the pods of namespaces labelled `podlock.io/inject=enabled`.
const NAMESPACE_PATH: &str = "/mutate/namespace";

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

/// A pod of a namespace that injects, but one that opts out.
const POD_STAYS_IN: &str = "!(has(object.metadata.annotations) && \
    'podlock.io/inject' in object.metadata.annotations && \
    object.metadata.annotations['podlock.io/inject'] == 'false')";

/// A workload annotated for podlock, or whose template holds copies to remove.
const WORKLOAD_ASKS: &str = "(has(object.metadata.annotations) && \
    'podlock.io/inject' in object.metadata.annotations) || \
    (has(object.spec.template.metadata) && has(object.spec.template.metadata.annotations) && \
    'podlock.io/inject-stamp' in object.spec.template.metadata.annotations)";

/// How the API server reaches the webhook's `path`: `--webhook-url` (whose path is `/mutate`,
/// to which the namespace path's `/namespace` is added), else the Service in `namespace`.
fn client_config(args: &WebhookArgs, namespace: &str, ca: Option<String>, path: &str) -> WebhookClientConfig {
    let service = ServiceReference {
        name: args.webhook_service.clone(),
        namespace: namespace.into(),
        path: Some(path.into()),
        port: Some(443),
    };
    let extra = path.strip_prefix(PATH).unwrap_or_default();
    WebhookClientConfig {
        url: (args.webhook_url.as_ref()).map(|url| format!("{}{extra}", url.trim_end_matches('/'))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    /// The webhook flags parsed from `args`, or clap's error.
    fn flags(args: &[&str]) -> Result<WebhookArgs, String> {
        let argv = std::iter::once("operator").chain(args.iter().copied());
        Flags::try_parse_from(argv)
            .map(|f| f.webhook)
            .map_err(|e| e.to_string())
    }

    /// The webhooks of the configuration for `args`, by name.
    fn webhooks(args: &[&str], watch: Option<&str>) -> BTreeMap<String, MutatingWebhook> {
        let config = configuration(&flags(args).unwrap(), "podlock", watch, None, None);
        let hooks = config.webhooks.unwrap().into_iter();
        hooks.map(|w| (w.name.clone(), w)).collect()
    }

    /// A selector's requirements as `key op values` strings, matchLabels as `key=value`.
    fn requirements(selector: &LabelSelector) -> BTreeSet<String> {
        let labels = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v}"));
        let expressions = selector.match_expressions.iter().flatten().map(|e| {
            format!(
                "{} {} {}",
                e.key,
                e.operator,
                e.values.clone().unwrap_or_default().join(",")
            )
        });
        labels.chain(expressions).collect()
    }
    use std::collections::BTreeSet;

    #[test]
    fn a_namespace_that_injects_has_its_pods_sent_to_its_own_path_once() {
        let hooks = webhooks(&[], None);
        let selector = |name: &str| requirements(hooks[name].namespace_selector.as_ref().unwrap());
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            selector("pods.inject.podlock.io"),
            strings(&[
                "kubernetes.io/metadata.name NotIn kube-system",
                "podlock.io/inject NotIn enabled"
            ])
        );
        assert_eq!(
            selector("namespace.inject.podlock.io"),
            strings(&[
                "kubernetes.io/metadata.name NotIn kube-system",
                "podlock.io/inject=enabled"
            ])
        );
        assert_eq!(
            selector("workloads.inject.podlock.io"),
            strings(&["kubernetes.io/metadata.name NotIn kube-system"])
        );
        let path = |name: &str| {
            let service = hooks[name].client_config.service.clone().unwrap();
            service.path.unwrap()
        };
        assert_eq!(path("pods.inject.podlock.io"), "/mutate");
        assert_eq!(path("namespace.inject.podlock.io"), "/mutate/namespace");
        let condition = &hooks["namespace.inject.podlock.io"]
            .match_conditions
            .as_ref()
            .unwrap()[0];
        assert!(
            condition.expression.contains("== 'false'"),
            "{}",
            condition.expression
        );
        // Outside the cluster, the URL's path gets the namespace's part too.
        let hooks = webhooks(&["--webhook-url", "https://127.0.0.1:9443/mutate"], None);
        let url = |name: &str| hooks[name].client_config.url.clone().unwrap();
        assert_eq!(url("pods.inject.podlock.io"), "https://127.0.0.1:9443/mutate");
        assert_eq!(
            url("namespace.inject.podlock.io"),
            "https://127.0.0.1:9443/mutate/namespace"
        );
    }

    #[test]
    fn the_namespace_selector_and_timeout_flags_reach_every_webhook() {
        let selector =
            r#"{"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}"#;
        let args = [
            "--webhook-namespace-selector",
            selector,
            "--webhook-timeout-seconds",
            "12",
        ];
        let hooks = webhooks(&args, Some("apps"));
        assert_eq!(hooks.len(), 3);
        for (name, hook) in &hooks {
            assert_eq!(hook.timeout_seconds, Some(12), "{name}");
            let found = requirements(hook.namespace_selector.as_ref().unwrap());
            for wanted in ["team=a", "tier Exists ", "kubernetes.io/metadata.name=apps"] {
                assert!(found.contains(wanted), "{name}: {wanted} not in {found:?}");
            }
        }
        assert!(webhooks(&[], None).values().all(|h| h.timeout_seconds == Some(5)));
        // Injection's wait for credentials stays within the timeout.
        assert_eq!(credentials_wait(5), Duration::from_secs(2));
        assert_eq!(credentials_wait(1), Duration::from_millis(400));
    }

    #[test]
    fn bad_webhook_and_sidecar_flags_are_refused_naming_the_flag() {
        for (args, says) in [
            (
                &["--webhook-timeout-seconds", "31"][..],
                "--webhook-timeout-seconds",
            ),
            (&["--webhook-timeout-seconds", "0"], "--webhook-timeout-seconds"),
            (&["--webhook-namespace-selector", "team=a"], "is not JSON"),
            (
                &["--webhook-namespace-selector", r#"{"matchLabel": {}}"#],
                "unknown key \"matchLabel\"",
            ),
            (
                &[
                    "--webhook-namespace-selector",
                    r#"{"matchExpressions": [{"key": "a", "operator": "In"}]}"#,
                ],
                "matchExpressions[0]",
            ),
            (
                &["--sidecar-resources", r#"{"requests": {"cpu": "ten"}}"#],
                "not a Kubernetes quantity",
            ),
            (&["--sidecar-log-level", "verbose"], "is not a log level"),
        ] {
            let err = flags(args).err().unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(err.contains(says) && err.contains(args[0]), "{args:?}: {err}");
        }
        let ok = flags(&[
            "--sidecar-resources",
            r#"{"limits": {"memory": "128Mi"}}"#,
            "--sidecar-log-level",
            "debug",
        ]);
        let ok = ok.unwrap();
        assert_eq!(ok.sidecar_log_level.as_deref(), Some("debug"));
        assert!(ok.sidecar_resources.unwrap().requests.is_none());
    }

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
