//! The webhook's certificate rotates without a restart: renewed files (as cert-manager renews
//! them) are served and `caBundle` follows them; a self-made certificate near its end or made
//! for other names is made again. The API server's trust is the proof: an annotated pod is
//! injected only if it accepts the webhook's certificate through `caBundle`.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

use crate::common::kube::{ControlPlane, Operator, with_crd};
use crate::common::wait_until;
use crate::injection::webhook_ready;

/// The operator's flags that serve the certificate files in `dir`.
pub fn tls_flags(dir: &Path) -> Vec<String> {
    let file = |f: &str| dir.join(f).display().to_string();
    [
        "--tls-cert-file",
        "tls.crt",
        "--tls-key-file",
        "tls.key",
        "--tls-ca-file",
        "ca.crt",
    ]
    .chunks(2)
    .flat_map(|flag| [flag[0].to_string(), file(flag[1])])
    .collect()
}

/// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` into `dir`: a new CA, and a serving
/// certificate it signed for `san` (e.g. `IP:127.0.0.1`), valid for `days`.
pub fn make_certificate(dir: &Path, san: &str, days: u32) {
    let sh = format!(
        "cd {d} && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days {days} \
         -subj /CN=test-ca -keyout ca.key -out ca.crt && \
         openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=podlock \
         -keyout tls.key -out tls.csr && \
         printf 'subjectAltName={san}' > ext && \
         openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days {days} -extfile ext -out tls.crt",
        d = dir.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &sh])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The webhook configuration's `caBundle` (base64) and URL.
fn registered(plane: &ControlPlane, ns: &str) -> (String, String) {
    let field = |path: &str| {
        let name = format!("podlock-{ns}");
        let jsonpath = format!("jsonpath={{.webhooks[0].clientConfig.{path}}}");
        plane
            .kubectl(&["get", "mutatingwebhookconfiguration", &name, "-o", &jsonpath])
            .1
    };
    (field("caBundle"), field("url"))
}

/// `pem` as the API server shows it in `caBundle`.
fn base64(pem: &str) -> String {
    let value = serde_json::to_value(ByteString(pem.as_bytes().to_vec())).unwrap();
    value.as_str().unwrap().to_string()
}

/// Whether the webhook at `url` completes a TLS handshake trusting only `ca_file`.
fn serves_certificate_of(url: &str, ca_file: &Path) -> bool {
    let host = url.trim_start_matches("https://").split('/').next().unwrap();
    let sh = format!(
        "openssl s_client -connect {host} -CAfile {} -verify_return_error </dev/null",
        ca_file.display()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &sh])
        .output()
        .unwrap();
    out.status.success()
}

/// Creates annotated pod `name` and says whether the API server had the webhook inject it.
async fn injected(plane: &ControlPlane, ns: &str, name: &str) -> bool {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns,
        "annotations": {"podlock.io/inject": "true"}}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string()).0);
    let pods: Api<Pod> = Api::namespaced(plane.client().await, ns);
    let spec = pods.get(name).await.unwrap().spec.unwrap();
    spec.init_containers
        .unwrap_or_default()
        .iter()
        .any(|c| c.name == "podlock")
}

#[tokio::test]
async fn renewed_certificate_files_are_served_and_trusted_without_a_restart() {
    let plane = with_crd();
    let ns = plane.namespace("cert-files");
    let (live, next) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_certificate(live.path(), "IP:127.0.0.1", 2);
    let mut flags = tls_flags(live.path());
    flags.extend(["--tls-reload-seconds".into(), "1".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let op = Operator::start_with(plane, &ns, &plane.etcd.endpoint, &flags).await;
    webhook_ready(plane, &ns).await;
    assert!(injected(plane, &ns, "before").await);

    // cert-manager renews the certificate, here under a new CA too.
    make_certificate(next.path(), "IP:127.0.0.1", 2);
    for f in ["ca.crt", "tls.key", "tls.crt"] {
        std::fs::copy(next.path().join(f), live.path().join(f)).unwrap();
    }
    let ca = std::fs::read_to_string(next.path().join("ca.crt")).unwrap();
    wait_until(Duration::from_secs(10), || async {
        let (bundle, url) = registered(plane, &ns);
        bundle == base64(&ca) && serves_certificate_of(&url, &next.path().join("ca.crt"))
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the renewed certificate is not served with its CA in caBundle ({e}):\n{}",
            op.log()
        )
    });
    assert!(injected(plane, &ns, "after").await, "{}", op.log());
}

/// Writes the certificate in `dir` (see [`make_certificate`]) into the Secret
/// `podlock-webhook-tls` of `ns`, with kubectl `verb` (create or replace).
fn put_secret(plane: &ControlPlane, ns: &str, dir: &Path, verb: &str) {
    let f = |name: &str| dir.join(name).display().to_string();
    let (tls, key) = (
        format!("--cert={}", f("tls.crt")),
        format!("--key={}", f("tls.key")),
    );
    let args = [
        "create",
        "secret",
        "tls",
        SECRET,
        "-n",
        ns,
        &tls,
        &key,
        "--dry-run=client",
        "-o",
        "json",
    ];
    let mut secret: serde_json::Value = serde_json::from_str(&plane.kubectl(&args).1).unwrap();
    let ca = std::fs::read_to_string(f("ca.crt")).unwrap();
    secret["data"]["ca.crt"] = json!(base64(&ca));
    let (ok, _, err) = plane.kubectl_stdin(&[verb, "-f", "-"], &secret.to_string());
    assert!(ok, "{err}");
}

/// Field `key` of the Secret `podlock-webhook-tls` of `ns`, base64 as the API server shows it.
fn secret_field(plane: &ControlPlane, ns: &str, key: &str) -> String {
    let jsonpath = format!("jsonpath={{.data.{}}}", key.replace('.', "\\."));
    plane
        .kubectl(&["get", "secret", SECRET, "-n", ns, "-o", &jsonpath])
        .1
}

const SECRET: &str = "podlock-webhook-tls";

#[tokio::test]
async fn a_self_made_certificate_for_other_names_or_near_its_end_is_made_again() {
    let plane = with_crd();
    let ns = plane.namespace("cert-self");
    // A certificate in the Secret made for another name: replaced when the operator starts.
    let (planted, expiring) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_certificate(planted.path(), "DNS:wrong.example", 30);
    put_secret(plane, &ns, planted.path(), "create");
    let op = Operator::start_with(plane, &ns, &plane.etcd.endpoint, &["--tls-reload-seconds", "1"]).await;
    webhook_ready(plane, &ns).await;
    assert!(injected(plane, &ns, "after-start").await, "{}", op.log());

    // Now one for the right name, but a day from its end: made again while running.
    make_certificate(expiring.path(), "IP:127.0.0.1", 1);
    put_secret(plane, &ns, expiring.path(), "replace");
    let expiring_cert = std::fs::read_to_string(expiring.path().join("tls.crt")).unwrap();
    let ca_path = expiring.path().join("served-ca.crt");
    wait_until(Duration::from_secs(10), || async {
        let (bundle, url) = registered(plane, &ns);
        let ca = secret_field(plane, &ns, "ca.crt");
        let pem = serde_json::from_value::<ByteString>(json!(ca)).unwrap().0;
        std::fs::write(&ca_path, pem).unwrap();
        secret_field(plane, &ns, "tls.crt") != base64(&expiring_cert)
            && bundle == ca
            && serves_certificate_of(&url, &ca_path)
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "no new certificate served with its CA in caBundle ({e}):\n{}",
            op.log()
        )
    });
    assert!(injected(plane, &ns, "after-renewal").await, "{}", op.log());
}
