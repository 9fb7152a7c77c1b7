//! Leader election with safe margins: a leader that can no longer renew its Lease stops
//! leading before another replica may take the Lease over, so two replicas never lead at once.
//! (The operators here run with a 3 s lease, a 2 s renew deadline and a 1 s retry period.)

use std::time::{Duration, Instant};

use crate::common::kube::{Operator, with_crd};
use crate::common::wait_until;

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_leading_before_another_takes_over() {
    let plane = with_crd();
    let ns = plane.namespace("leader-cut");
    // Replica A runs as a ServiceAccount with every right in the namespace, through a
    // RoleBinding that the test deletes to cut A off (as a network partition would).
    let account = format!("{ns}:cut");
    for create in [
        &["create", "serviceaccount", "cut", "-n", &ns][..],
        &[
            "create",
            "rolebinding",
            "cut",
            "--clusterrole=cluster-admin",
            "--serviceaccount",
            &account,
            "-n",
            &ns,
        ],
    ] {
        let (ok, _, err) = plane.kubectl(create);
        assert!(ok || err.contains("AlreadyExists"), "{err}");
    }
    let (_dir, kubeconfig) = plane.token_kubeconfig(&ns, "cut");
    let a = Operator::start_as(&kubeconfig, &ns, &plane.etcd.endpoint, &[]).await;
    wait_until(Duration::from_secs(10), || a.leads())
        .await
        .unwrap_or_else(|e| panic!("A never led ({e}):\n{}", a.log()));
    let b = Operator::start(plane, &ns).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!b.leads().await, "B leads while A renews:\n{}", b.log());

    assert!(plane.kubectl(&["delete", "rolebinding", "cut", "-n", &ns]).0);
    let (a_stopped, took_over) = handover(&a, &b).await;
    assert!(b.leads().await, "B never took over:\n{}", b.log());
    let a_stopped = a_stopped.expect("A stopped leading before B led");
    eprintln!("after the cut: A stopped leading at {a_stopped:?}, B led at {took_over:?}");
    assert!(
        took_over - a_stopped >= Duration::from_millis(500),
        "A stopped only {:?} before B took over",
        took_over - a_stopped
    );
}

/// Watches A and B every 50 ms for up to 15 s from now, until B leads, asserting that they never
/// lead at once; returns when A stopped leading, if it did, and when B led (or the time ran out).
async fn handover(a: &Operator, b: &Operator) -> (Option<Duration>, Duration) {
    let cut = Instant::now();
    let mut a_stopped = None;
    while cut.elapsed() < Duration::from_secs(15) {
        let (a_leads, b_leads) = (a.leads().await, b.leads().await);
        assert!(
            !(a_leads && b_leads),
            "two leaders {:?} after A was cut off:\nA:\n{}\nB:\n{}",
            cut.elapsed(),
            a.log(),
            b.log()
        );
        if !a_leads && a_stopped.is_none() {
            a_stopped = Some(cut.elapsed());
        }
        if b_leads {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (a_stopped, cut.elapsed())
}
