//! The webhook's flags of `podlock operator`, and the checks of their values.

use clap::Args;
use k8s_openapi::api::core::v1::{ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::operator::inject;

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
    /// How long the API server waits for the webhook's answer, in seconds, before it applies
    /// --webhook-failure-policy.
    #[arg(long, env = "PODLOCK_WEBHOOK_TIMEOUT_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(i32).range(1..=30))]
    pub webhook_timeout_seconds: i32,
    /// A label selector (JSON: matchLabels, matchExpressions) that namespaces must match, too,
    /// to be injected, e.g. {"matchExpressions":[{"key":"team","operator":"In","values":["a"]}]}.
    #[arg(long, env = "PODLOCK_WEBHOOK_NAMESPACE_SELECTOR", value_parser = label_selector)]
    pub webhook_namespace_selector: Option<LabelSelector>,
    /// A label selector (JSON, as --webhook-namespace-selector) that pods and workloads must
    /// match, too, by their own labels (a workload's, not its template's), to be injected.
    #[arg(long, env = "PODLOCK_WEBHOOK_OBJECT_SELECTOR", value_parser = label_selector)]
    pub webhook_object_selector: Option<LabelSelector>,
    /// What the API server does with a pod that asked for the sidecar when the webhook cannot
    /// be reached or does not answer in time: Ignore creates it without the sidecar, Fail
    /// refuses it (its controller retries). Only objects that ask for podlock are concerned.
    #[arg(long, env = "PODLOCK_WEBHOOK_FAILURE_POLICY", default_value = "Ignore", value_parser = ["Ignore", "Fail"])]
    pub webhook_failure_policy: String,
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
    /// The injected sidecar's API port where a pod's `podlock.io/port` sets none (its metrics
    /// port is the next one); e.g. 4050 where apps use 4040 (the Spark UI).
    #[arg(long, env = "PODLOCK_SIDECAR_PORT", default_value_t = inject::flags::DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1024..))]
    pub sidecar_port: u16,
    /// Pull secrets (comma-separated names) added to every injected pod, for the sidecar's
    /// image; each must exist in the pod's namespace.
    #[arg(long, env = "PODLOCK_SIDECAR_IMAGE_PULL_SECRETS", value_delimiter = ',', value_parser = inject::flags::secret_name)]
    pub sidecar_image_pull_secrets: Vec<String>,
    /// The injected sidecar's whole securityContext, JSON (default: the restricted profile,
    /// runAsUser 65532), e.g. without runAsUser and runAsGroup for OpenShift.
    #[arg(long, env = "PODLOCK_SIDECAR_SECURITY_CONTEXT", value_parser = inject::flags::security_context)]
    pub sidecar_security_context: Option<SecurityContext>,
    /// The installation's name (the chart passes its release name): injected pods are labelled
    /// `podlock.io/instance=<this>`, which the bundled etcd's NetworkPolicy admits.
    #[arg(long, env = "PODLOCK_INSTANCE", default_value = "podlock", value_parser = label_value)]
    pub instance: String,
}

/// `--webhook-namespace-selector`, `--webhook-object-selector`: a label selector as JSON, with
/// only matchLabels and matchExpressions (operators In, NotIn with values, Exists, DoesNotExist
/// without).
pub(super) fn label_selector(text: &str) -> Result<LabelSelector, String> {
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
pub(super) fn label_value(value: &str) -> Result<String, String> {
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
