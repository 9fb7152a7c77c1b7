//! Unit tests of the webhook's flags and configuration.

use super::args::*;
use super::configuration::*;
use super::webhook::*;
use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
        assert_eq!(label_value(good).as_deref(), Ok(good));
    }
    for bad in ["", "-podlock", "podlock-", "pod lock", "a/b", &"x".repeat(64)] {
        let err = label_value(bad).unwrap_err();
        assert!(err.contains("label value"), "{bad:?}: {err}");
    }
}

#[test]
fn the_failure_policy_and_object_selector_flags_reach_every_webhook() {
    let hooks = webhooks(&[], None);
    assert!(
        hooks
            .values()
            .all(|h| h.failure_policy.as_deref() == Some("Ignore"))
    );
    let selector = r#"{"matchExpressions": [{"key": "podlock", "operator": "NotIn", "values": ["off"]}]}"#;
    let args = [
        "--webhook-failure-policy",
        "Fail",
        "--webhook-object-selector",
        selector,
    ];
    let hooks = webhooks(&args, None);
    assert_eq!(hooks.len(), 3);
    for (name, hook) in &hooks {
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"), "{name}");
        let found = requirements(hook.object_selector.as_ref().unwrap());
        // The operator's own pods stay out, whatever the selector.
        for wanted in [
            "podlock NotIn off",
            "app.kubernetes.io/component NotIn podlock-operator",
        ] {
            assert!(found.contains(wanted), "{name}: {wanted} not in {found:?}");
        }
    }
    for (args, says) in [
        (
            &["--webhook-failure-policy", "Sometimes"][..],
            "possible values: Ignore, Fail",
        ),
        (&["--webhook-object-selector", "app=x"], "is not JSON"),
    ] {
        let err = flags(args).err().unwrap_or_else(|| panic!("{args:?} accepted"));
        assert!(err.contains(says) && err.contains(args[0]), "{args:?}: {err}");
    }
}
