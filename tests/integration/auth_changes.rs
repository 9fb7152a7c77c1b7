//! etcd's auth store changes under running sidecars: a new namespace provisioned, an operator
//! restarted (a `helm upgrade`). Each change of a user, role or permission moves etcd's auth
//! revision on, and etcd refuses a request whose token was checked at an older one ("revision
//! of auth store is old"); a password change ends every token of its user. Holds must live on,
//! and a sidecar whose password changed (in etcd and in its mounted Secret) locks again.

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::kube::{Operator, with_crd};
use crate::common::{EtcdServer, Sidecar, bin_dir, wait_until};
use crate::isolation::{ISOLATED, credentials, declare_shared, isolated, sidecar_with, takes_with};

/// etcd's auth revision (`etcdctl auth status`, as root).
fn auth_revision(endpoint: &str) -> u64 {
    let out = Command::new(bin_dir().join("etcdctl"))
        .args([
            "--endpoints",
            endpoint,
            "--user",
            "root:root-secret",
            "auth",
            "status",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let revision = text.lines().find_map(|l| l.strip_prefix("AuthRevision:"));
    revision.and_then(|r| r.trim().parse().ok()).unwrap_or_else(|| {
        panic!(
            "etcdctl auth status: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A restarted operator provisions its namespaces again: it must find their role, user and
/// password as they are and change nothing, or every sidecar's token goes stale at once.
#[tokio::test]
async fn a_restarted_operator_leaves_etcds_auth_as_it_is() {
    let plane = with_crd();
    let ns = plane.namespace("auth-restart");
    let (etcd, op) = isolated(plane, &ns).await;
    declare_shared(plane, &ns);
    let creds = credentials(plane, &ns).await;
    let before = auth_revision(&etcd.endpoint);
    drop(op);
    let op = Operator::start_with(plane, &ns, &etcd.endpoint, &ISOLATED).await;
    // Every series exists from the start: wait for a reconciliation that succeeded.
    let reconciled = wait_until(Duration::from_secs(15), || async {
        let metrics = op.metrics().await;
        let ok = metrics
            .lines()
            .find_map(|l| l.strip_prefix("podlock_reconcile_total{result=\"ok\"} "));
        ok.is_some_and(|n| n.trim() != "0")
    });
    reconciled
        .await
        .unwrap_or_else(|e| panic!("not reconciled ({e}):\n{}", op.log()));
    assert_eq!(auth_revision(&etcd.endpoint), before, "{}", op.log());
    takes_with(&etcd.endpoint, &ns, creds, "shared").await;
}

/// A sidecar whose requests meet auth changes (etcd answers "revision of auth store is old")
/// authenticates again and carries on, as etcd's Go client does.
#[tokio::test]
async fn a_sidecar_carries_on_while_etcds_auth_changes() {
    let plane = with_crd();
    let ns = plane.namespace("auth-churn");
    let (etcd, _op) = isolated(plane, &ns).await;
    declare_shared(plane, &ns);
    let pod = sidecar_with(&etcd.endpoint, &ns, credentials(plane, &ns).await).await;
    let root = etcd_client::ConnectOptions::new().with_user("root", "root-secret");
    let mut root = etcd_client::Client::connect([etcd.endpoint.as_str()], Some(root))
        .await
        .unwrap();
    let churn = tokio::spawn(async move {
        for i in 0.. {
            let role = format!("churn-{}", i % 2);
            if root.role_add(role.as_str()).await.is_err() {
                root.role_delete(role.as_str()).await.unwrap();
            }
        }
    });
    let (start, mut rounds) = (Instant::now(), 0);
    while start.elapsed() < Duration::from_secs(3) {
        for call in ["acquire", "release"] {
            let (status, body) = pod.post("shared", call, json!({})).await;
            assert_eq!(status, 200, "{call} #{rounds} while etcd's auth changed: {body}");
        }
        rounds += 1;
    }
    churn.abort();
    eprintln!("{rounds} acquire-release rounds while etcd's auth changed");
}

/// A sidecar reads its credentials from a directory (the mounted Secret, which the kubelet
/// refreshes in place). Its password changes in etcd, then, a little later, in its files (as
/// after a reinstall on a new etcd, #41): refused meanwhile, it connects anew with the new
/// password and locks again, with no restart, and its log says why it connected anew.
#[tokio::test]
async fn a_sidecar_locks_again_once_its_password_changes_in_etcd_and_in_its_files() {
    let etcd = EtcdServer::start().await;
    etcd.enable_auth("root-secret").await;
    let root = etcd_client::ConnectOptions::new().with_user("root", "root-secret");
    let mut root = etcd_client::Client::connect([etcd.endpoint.as_str()], Some(root))
        .await
        .unwrap();
    root.user_add("app", "old-secret", None).await.unwrap();
    root.user_grant_role("app", "root").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let password = |p: &str| std::fs::write(dir.path().join("password"), p).unwrap();
    std::fs::write(dir.path().join("username"), "app").unwrap();
    password("old-secret");
    let args = [
        "--standalone",
        "--etcd-credentials-dir",
        dir.path().to_str().unwrap(),
    ];
    let pod = Sidecar::start(&etcd.endpoint, "pod", &args).await;
    pod.must_acquire("l", json!({})).await;
    assert_eq!(pod.post("l", "release", json!({})).await.0, 200);

    root.user_change_password("app", "new-secret").await.unwrap();
    let (status, body) = pod.post("l", "acquire", json!({})).await;
    assert_ne!(status, 200, "acquired with a password etcd no longer has: {body}");
    tokio::time::sleep(Duration::from_secs(2)).await; // the kubelet takes its time too
    password("new-secret");
    let took = wait_until(Duration::from_secs(30), || async {
        pod.post("l", "acquire", json!({})).await.0 == 200
    })
    .await
    .unwrap_or_else(|e| panic!("no lock with the new password ({e}):\n{}", pod.log()));
    let log = pod.log();
    let why: Vec<&str> = log.lines().filter(|l| l.contains("connecting anew")).collect();
    eprintln!("locked again {took:?} after the new password was written; the sidecar:");
    why.iter().for_each(|l| eprintln!("  {l}"));
    assert!(
        why.iter().any(|l| l.contains("password")),
        "no cause logged:\n{log}"
    );
}

/// Replicas and the webhook provision a new namespace at the same moment: each finds the role
/// and user another has just added and goes on, rather than failing on "already exists" (a
/// failed provisioning fails the webhook's injection or the lock's reconciliation).
#[tokio::test]
async fn concurrent_provisioning_of_one_namespace_all_succeeds() {
    let etcd = crate::common::EtcdServer::start().await;
    etcd.enable_auth("root-secret").await;
    let root = etcd_client::ConnectOptions::new().with_user("root", "root-secret");
    let client = etcd_client::Client::connect([etcd.endpoint.as_str()], Some(root))
        .await
        .unwrap();
    let store = podlock::lock::Store::new(client);
    let provision = |store: podlock::lock::Store| async move {
        let user = "podlock-ns-racing";
        store.ensure_role("racing", user).await?;
        let password = store.namespace_password("racing", "a-candidate").await?;
        store.set_user(user, &password.password, user).await
    };
    let racers: Vec<_> = (0..4).map(|_| tokio::spawn(provision(store.clone()))).collect();
    for racer in racers {
        racer
            .await
            .unwrap()
            .expect("provisioning while others provision too");
    }
}
