//! The operator's flags for the injected sidecar's settings (`--sidecar-resources`,
//! `--sidecar-log-level`, `--sidecar-security-context`, `--sidecar-image-pull-secrets`), read
//! and checked at start: a value the API server would refuse in a pod, or the sidecar would not
//! understand, stops the operator naming the flag, instead of breaking every injected pod later.

use k8s_openapi::api::core::v1::{ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;
use std::collections::BTreeMap;

/// `--sidecar-resources`: JSON `{"requests": {NAME: QUANTITY}, "limits": {NAME: QUANTITY}}`
/// (what the chart's `sidecar.resources` renders to), each part optional; a number is taken
/// as a quantity (`{"cpu": 1}`). Every request must be at most its limit, as the API server
/// demands of a pod.
pub fn resources(text: &str) -> Result<ResourceRequirements, String> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("{text:?} is not JSON ({e}); e.g. {{\"requests\": {{\"cpu\": \"10m\"}}}}"))?;
    let Value::Object(parts) = value else {
        return Err(format!("{text:?} is not a JSON object with requests and limits"));
    };
    let mut requirements = ResourceRequirements::default();
    for (part, quantities) in parts {
        let map = match (part.as_str(), quantities) {
            (_, Value::Null) => continue,
            ("requests" | "limits", Value::Object(map)) => map,
            ("requests" | "limits", other) => {
                return Err(format!("{part} must be an object of quantities, got {other}"));
            }
            _ => return Err(format!("unknown key {part:?}: only requests and limits")),
        };
        let mut checked = BTreeMap::new();
        for (name, q) in map {
            let q = match q {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                other => return Err(format!("{part}.{name} must be a quantity, got {other}")),
            };
            if quantity_value(&q).is_none() {
                return Err(format!(
                    "{part}.{name} {q:?} is not a Kubernetes quantity (e.g. 100m, 0.5, 64Mi, 1G)"
                ));
            }
            checked.insert(name, Quantity(q));
        }
        match part.as_str() {
            "requests" => requirements.requests = Some(checked),
            _ => requirements.limits = Some(checked),
        }
    }
    let (requests, limits) = (&requirements.requests, &requirements.limits);
    for (name, request) in requests.iter().flatten() {
        let Some(limit) = limits.as_ref().and_then(|l| l.get(name)) else {
            continue;
        };
        if quantity_value(&request.0) > quantity_value(&limit.0) {
            return Err(format!(
                "requests.{name} {:?} is more than limits.{name} {:?}: the API server would refuse every injected pod",
                request.0, limit.0
            ));
        }
    }
    Ok(requirements)
}

/// The value of a Kubernetes quantity (`100m`, `64Mi`, `1e3`, `0.5`), or `None` when it is
/// not one.
fn quantity_value(q: &str) -> Option<f64> {
    let end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(end);
    let unsigned = number.strip_prefix(['+', '-']).unwrap_or(number);
    let digits_ok = !unsigned.is_empty()
        && unsigned.chars().all(|c| c.is_ascii_digit() || c == '.')
        && unsigned.matches('.').count() <= 1
        && unsigned != ".";
    if !digits_ok {
        return None;
    }
    let n: f64 = number.parse().ok()?;
    let binary = |p: i32| Some(1024f64.powi(p));
    let decimal = |p: i32| Some(10f64.powi(p));
    let factor = match suffix {
        "" => Some(1.0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        e => {
            let exp = e.strip_prefix(['e', 'E'])?;
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            decimal(exp.parse().ok()?)
        }
    };
    Some(n * factor?)
}

/// The levels a log filter may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// `--sidecar-log-level`: what the sidecar logs, as its `PODLOCK_LOG`: a level (`debug`), or
/// comma-separated `TARGET=LEVEL` directives after an optional level (`info,podlock=debug`).
pub fn log_level(text: &str) -> Result<String, String> {
    let target_ok = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
    };
    for directive in text.split(',') {
        let (target, level) = match directive.split_once('=') {
            Some((target, level)) => (Some(target), level),
            None => (None, directive),
        };
        let ok = LEVELS.contains(&level.to_ascii_lowercase().as_str()) && target.is_none_or(target_ok);
        if !ok {
            return Err(format!(
                "{directive:?} in {text:?} is not a log level ({}) or TARGET=LEVEL, e.g. info,podlock=debug",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(text.to_string())
}

/// What a platform sets in every injected pod (`--sidecar-port`, `--sidecar-image-pull-secrets`,
/// `--sidecar-security-context`).
#[derive(Debug, Clone)]
pub struct PodSettings {
    /// The sidecar's API port where a pod's `podlock.io/port` sets none.
    pub port: u16,
    /// Pull secrets added to every injected pod, for the sidecar's image.
    pub image_pull_secrets: Vec<String>,
    /// The sidecar container's securityContext (`None`: the restricted profile, UID 65532).
    pub security_context: Option<SecurityContext>,
}

impl Default for PodSettings {
    fn default() -> Self {
        PodSettings {
            port: DEFAULT_PORT,
            image_pull_secrets: vec![],
            security_context: None,
        }
    }
}

/// The sidecar's API port by default.
pub const DEFAULT_PORT: u16 = 4040;

/// The securityContext fields a sidecar may be given (those of a container that the Pod
/// Security Standards name, and the identity fields OpenShift assigns).
const SECURITY_FIELDS: [&str; 10] = [
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "readOnlyRootFilesystem",
    "allowPrivilegeEscalation",
    "privileged",
    "capabilities",
    "seccompProfile",
    "seLinuxOptions",
    "appArmorProfile",
];

/// `--sidecar-security-context`: the sidecar container's whole securityContext, JSON (what the
/// chart's `sidecar.securityContext` renders to), e.g. without `runAsUser` for OpenShift, which
/// assigns one.
pub fn security_context(text: &str) -> Result<SecurityContext, String> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("{text:?} is not JSON ({e}); e.g. {{\"runAsNonRoot\": true}}"))?;
    let Value::Object(fields) = &value else {
        return Err(format!("{text:?} is not a JSON object"));
    };
    if let Some(field) = fields.keys().find(|k| !SECURITY_FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field {field:?}: one of {}",
            SECURITY_FIELDS.join(", ")
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("not a securityContext: {e}"))
}

/// One name of `--sidecar-image-pull-secrets`: a Secret's name (a DNS subdomain).
pub fn secret_name(name: &str) -> Result<String, String> {
    let label = |l: &str| {
        !l.is_empty()
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let ok = name.len() <= 253 && name.split('.').all(label);
    ok.then(|| name.to_string())
        .ok_or_else(|| format!("{name:?} is not a Secret name (lower-case letters, digits, '-' and '.')"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_security_context_and_secret_names_are_checked() {
        let openshift = security_context(r#"{"runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}"#);
        let openshift = openshift.unwrap();
        assert_eq!(openshift.run_as_user, None);
        assert_eq!(openshift.run_as_non_root, Some(true));
        for (bad, says) in [
            ("runAsUser=1", "is not JSON"),
            ("[]", "not a JSON object"),
            (r#"{"runAsUsr": 1}"#, "unknown field \"runAsUsr\""),
            (r#"{"runAsUser": "root"}"#, "not a securityContext"),
        ] {
            let err = security_context(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert_eq!(secret_name("regcred").as_deref(), Ok("regcred"));
        for bad in ["", "Regcred", "reg cred", "-x", "a..b"] {
            assert!(
                secret_name(bad).unwrap_err().contains("not a Secret name"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn resources_are_read_from_json_and_bad_ones_are_named() {
        let r = resources(
            r#"{"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi", "cpu": 1}}"#,
        )
        .unwrap();
        assert_eq!(r.requests.unwrap()["memory"], Quantity("16Mi".into()));
        assert_eq!(r.limits.unwrap()["cpu"], Quantity("1".into()));
        assert!(resources("{}").unwrap().requests.is_none());
        assert!(
            resources(r#"{"limits": {"cpu": "1.5", "memory": "1e9", "ephemeral-storage": "1G"}}"#).is_ok()
        );
        for (bad, says) in [
            ("cpu=10m", "is not JSON"),
            ("[]", "not a JSON object"),
            (r#"{"request": {}}"#, "unknown key \"request\""),
            (r#"{"requests": "10m"}"#, "requests must be an object"),
            (
                r#"{"requests": {"cpu": "ten"}}"#,
                "requests.cpu \"ten\" is not a Kubernetes quantity",
            ),
            (r#"{"limits": {"memory": "64MB"}}"#, "limits.memory \"64MB\""),
            (
                r#"{"limits": {"memory": true}}"#,
                "limits.memory must be a quantity",
            ),
            (
                r#"{"requests": {"memory": "128Mi"}, "limits": {"memory": "64Mi"}}"#,
                "requests.memory \"128Mi\" is more than limits.memory \"64Mi\"",
            ),
        ] {
            let err = resources(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn quantities_are_valued_as_kubernetes_does() {
        assert_eq!(quantity_value("100m"), Some(0.1));
        assert_eq!(quantity_value("64Mi"), Some(64.0 * 1024.0 * 1024.0));
        assert_eq!(quantity_value("1e3"), Some(1000.0));
        assert_eq!(quantity_value("2"), Some(2.0));
        for bad in ["", "m", ".", "1..2", "1x", "1e", "Mi", "1 Mi"] {
            assert_eq!(quantity_value(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_log_level_or_filter_is_accepted_and_anything_else_named() {
        for good in ["debug", "info,podlock=debug", "warn,kube=error", "INFO"] {
            assert_eq!(log_level(good).as_deref(), Ok(good));
        }
        for bad in ["", "verbose", "info,", "podlock=loud", "a b=info"] {
            let err = log_level(bad).unwrap_err();
            assert!(err.contains("is not a log level"), "{bad:?}: {err}");
        }
    }
}
