//! The `MutatingWebhookConfiguration` named `podlock`, kept pointing at the webhook with a
//! current `caBundle`: which objects and namespaces the API server sends to it, and at which
//! path.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use kube::api::{Api, Patch};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::warn;

use super::args::WebhookArgs;
use crate::operator::inject;

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
/// `kube-system`; and only in namespaces that `--webhook-namespace-selector` selects, objects
/// that `--webhook-object-selector` selects.
pub(super) fn configuration(
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
        failure_policy: Some(args.webhook_failure_policy.clone()),
        timeout_seconds: Some(args.webhook_timeout_seconds),
        client_config: client,
        rules: Some(rules),
        match_conditions: Some(vec![MatchCondition {
            name: "podlock-annotated".into(),
            expression: condition.into(),
        }]),
        namespace_selector: Some(namespaces),
        object_selector: Some(both(
            not_in(inject::OPERATOR_LABEL.0, inject::OPERATOR_LABEL.1),
            args.webhook_object_selector.clone(),
        )),
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
pub(super) const PATH: &str = "/mutate";
/// The webhook's path for the pods of namespaces labelled `podlock.io/inject=enabled`.
pub(super) const NAMESPACE_PATH: &str = "/mutate/namespace";

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
pub(super) fn client_config(
    args: &WebhookArgs,
    namespace: &str,
    ca: Option<String>,
    path: &str,
) -> WebhookClientConfig {
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
