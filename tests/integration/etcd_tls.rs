//! etcd with TLS and auth, end to end: the operator gives each namespace's credentials Secret
//! etcd's CA too, the webhook mounts it into the sidecar, and a sidecar with exactly what that
//! Secret holds takes a lock over TLS.

use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::certs::make_certificate;
use crate::common::kube::{Operator, with_crd};
use crate::common::{ETCD_FEATURE_GATES, Sidecar, bin_dir, free_port, spawn_dying_with_parent, wait_until};
use crate::isolation::credentials;

/// A one-member etcd serving clients over TLS with the certificate in `dir` (killed on drop
/// of the child); returns it, its endpoint and a root client.
async fn tls_etcd(dir: &Path) -> (Child, String, Client) {
    let (client_port, peer_port) = (free_port(), free_port());
    let endpoint = format!("https://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let file = |f: &str| dir.join(f).display().to_string();
    let child = spawn_dying_with_parent(
        Command::new(bin_dir().join("etcd"))
            .args(["--name", "tls", "--data-dir", &file("data")])
            .args([
                "--listen-client-urls",
                &endpoint,
                "--advertise-client-urls",
                &endpoint,
            ])
            .args(["--cert-file", &file("tls.crt"), "--key-file", &file("tls.key")])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("tls={peer}"), ETCD_FEATURE_GATES])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let options =
        || ConnectOptions::new().with_tls(TlsOptions::new().ca_certificate(Certificate::from_pem(&ca)));
    let start = std::time::Instant::now();
    let client = loop {
        if let Ok(mut c) = Client::connect([&endpoint], Some(options())).await
            && c.status().await.is_ok()
        {
            break c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "etcd over TLS never answered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    (child, endpoint, client)
}

#[tokio::test]
async fn a_sidecar_with_its_namespaces_secret_takes_a_lock_over_tls() {
    let plane = with_crd();
    let ns = plane.namespace("etcd-tls");
    let dir = tempfile::tempdir().unwrap();
    make_certificate(dir.path(), "IP:127.0.0.1", 2);
    let (_etcd, endpoint, mut root) = tls_etcd(dir.path()).await;
    root.user_add("root", "root-secret", None).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.auth_enable().await.unwrap();
    let ca_file = dir.path().join("ca.crt").display().to_string();
    let flags = [
        "--etcd-user",
        "root",
        "--etcd-password",
        "root-secret",
        "--etcd-ca-file",
        &ca_file,
    ];
    let op = Operator::start_with(plane, &ns, &endpoint, &flags).await;
    let lock = format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: guarded, namespace: {ns}}}\nspec: {{ttlSeconds: 30}}\n"
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock).0);

    // The namespace's Secret carries etcd's CA with its credentials.
    let (user, password) = credentials(plane, &ns).await;
    let secrets: Api<Secret> = Api::namespaced(plane.client().await, &ns);
    let data = secrets.get("podlock-etcd").await.unwrap().data.unwrap();
    let ca = data
        .get("ca.crt")
        .unwrap_or_else(|| panic!("no ca.crt in podlock-etcd:\n{}", op.log()));
    assert_eq!(ca.0, std::fs::read(&ca_file).unwrap());

    // A sidecar with exactly that (as the injected one gets it) takes the lock over TLS.
    let own_ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(own_ca.path(), &ca.0).unwrap();
    let own_ca = own_ca.path().display().to_string();
    let args = [
        "--namespace",
        &ns,
        "--etcd-user",
        &user,
        "--etcd-password",
        &password,
        "--etcd-ca-file",
        &own_ca,
    ];
    let sidecar = Sidecar::start(&endpoint, "p", &args).await;
    wait_until(Duration::from_secs(15), || async {
        sidecar
            .post("guarded", "acquire", json!({"waitSeconds": 0}))
            .await
            .0
            == 200
    })
    .await
    .unwrap_or_else(|e| panic!("no lock over TLS ({e}):\n{}", sidecar.log()));
}
