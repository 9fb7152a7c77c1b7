//! The bundled etcd keeps namespaces apart on a real node: a pod with namespace `tenant`'s
//! etcd credentials (as its injected sidecar has them) can read `tenant`'s keys but neither
//! read nor delete namespace `app`'s, and a pod without credentials gets nothing from etcd,
//! whether it speaks plain HTTP, TLS without a user, or guesses root's password. etcdctl runs
//! in pods from the bundled etcd's own image. Both pods carry the labels of an injected pod
//! (any pod may label itself so), so the NetworkPolicy lets them reach etcd's port: what
//! refuses the one without credentials is TLS and auth (`network_policy` shows the policy
//! refusing pods without those labels).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::node::{Node, retry};

/// Every member's client URL.
const ENDPOINTS: &str = "https://podlock-etcd-0.podlock-etcd.podlock.svc:2379,\
https://podlock-etcd-1.podlock-etcd.podlock.svc:2379,https://podlock-etcd-2.podlock-etcd.podlock.svc:2379";

/// etcdctl's timeouts, so that a refused connection ends the command.
const TIMEOUTS: &str = "{name: ETCDCTL_DIAL_TIMEOUT, value: 5s}, {name: ETCDCTL_COMMAND_TIMEOUT, value: 10s}";

/// A pod in namespace `tenant`, labelled like an injected pod, running one etcdctl command per
/// container (`name`, args). With `credentials`, it has what the sidecar has: the namespace's
/// Secret `podlock-etcd` (user, password, CA).
fn etcdctl_pod(node: &Node, name: &str, credentials: bool, commands: &[(&str, &str)]) -> String {
    let (env, mount, volumes) = match credentials {
        true => (
            format!(
                "{TIMEOUTS}, {{name: ETCDCTL_ENDPOINTS, value: \"{ENDPOINTS}\"}}, \
                 {{name: ETCDCTL_CACERT, value: /creds/ca.crt}}, \
                 {{name: ETCDCTL_USER, valueFrom: {{secretKeyRef: {{name: podlock-etcd, key: username}}}}}}, \
                 {{name: ETCDCTL_PASSWORD, valueFrom: {{secretKeyRef: {{name: podlock-etcd, key: password}}}}}}"
            ),
            ", volumeMounts: [{name: creds, mountPath: /creds}]",
            "  volumes: [{name: creds, secret: {secretName: podlock-etcd}}]\n",
        ),
        false => (TIMEOUTS.to_string(), "", ""),
    };
    let labels = "podlock.io/sidecar: \"true\", podlock.io/instance: podlock";
    let containers: Vec<String> = commands
        .iter()
        .map(|(c, args)| {
            format!(
                "    - {{name: {c}, image: {image}, imagePullPolicy: Never, command: [/usr/local/bin/etcdctl], \
                 args: [{args}], env: [{env}]{mount}}}",
                image = node.images["ETCD_IMAGE"]
            )
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: tenant, labels: {{{labels}}}}}\n\
         spec:\n  restartPolicy: Never\n{volumes}  containers:\n{}\n",
        containers.join("\n")
    )
}

/// Waits until pod `name` of `tenant` ended; returns each container's exit code and log.
fn outcomes(node: &Node, name: &str) -> BTreeMap<String, (i64, String)> {
    let ended = retry(Duration::from_secs(120), || {
        let (_, phase, _) = node.kubectl(&[
            "get",
            "pod",
            name,
            "-n",
            "tenant",
            "-o",
            "jsonpath={.status.phase}",
        ]);
        matches!(phase.as_str(), "Succeeded" | "Failed")
            .then_some(())
            .ok_or(phase)
    });
    let (_, status, _) = node.kubectl(&["get", "pod", name, "-n", "tenant", "-o", "json"]);
    assert!(ended.is_ok(), "pod {name} did not end: {status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let mut out = BTreeMap::new();
    for c in status["status"]["containerStatuses"].as_array().unwrap() {
        let container = c["name"].as_str().unwrap();
        let code = c["state"]["terminated"]["exitCode"].as_i64().unwrap();
        let (_, log, _) = node.kubectl(&["logs", name, "-n", "tenant", "-c", container]);
        out.insert(container.to_string(), (code, log.trim().to_string()));
    }
    out
}

/// The insider pod's outcomes: namespace `tenant`'s credentials against its own keys and app's.
/// When none of its commands reached etcd at all (twice in node runs: a member refused
/// connections, and an authenticating etcdctl 3.5 did not fail over), the pod is run once more
/// after every member is Ready, with the members' state printed: that outcome says nothing of
/// isolation either way, and a second one fails the assertions below as any other would.
fn insider(node: &Node) -> BTreeMap<String, (i64, String)> {
    let run = || {
        node.kubectl_apply(&etcdctl_pod(
            node,
            "insider",
            true,
            &[
                ("own", "get, --prefix, --keys-only, /podlock/v1/config/tenant/"),
                ("read-app", "get, --prefix, /podlock/v1/queue/app/"),
                ("delete-app", "del, --prefix, /podlock/v1/queue/app/"),
            ],
        ));
        outcomes(node, "insider")
    };
    let first = run();
    let unreachable = |(_, log): &(i64, String)| log.contains("context deadline exceeded");
    if !first.values().all(unreachable) {
        return first;
    }
    let (_, members, _) = node.kubectl(&["get", "pods", "-n", "podlock", "-o", "wide"]);
    eprintln!("insider: no command reached etcd; the members, then a second run:\n{members}");
    node.kubectl(&["delete", "pod", "insider", "-n", "tenant", "--wait=true"]);
    node.kubectl(&[
        "wait",
        "pod",
        "-n",
        "podlock",
        "-l",
        "app.kubernetes.io/component=etcd",
        "--for=condition=Ready",
        "--timeout=120s",
    ]);
    run()
}

/// Namespace `tenant` (with a lock, so the operator gives it etcd credentials) against the
/// keys of namespace `app`, whose lock `work` is held.
pub fn a_namespace_cannot_touch_anothers_keys_nor_anyone_etcd_without_credentials(node: &Node) {
    node.kubectl(&["create", "namespace", "tenant"]);
    node.kubectl_apply(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {name: mine, namespace: tenant}\nspec: {}\n",
    );
    let secret = retry(Duration::from_secs(60), || {
        let (ok, _, err) = node.kubectl(&["get", "secret", "podlock-etcd", "-n", "tenant"]);
        ok.then_some(()).ok_or(err)
    });
    assert!(
        secret.is_ok(),
        "no etcd credentials for namespace tenant (no etcd auth?): {secret:?}"
    );
    let plain = ENDPOINTS.replace("https://", "http://");
    node.kubectl_apply(&etcdctl_pod(node, "stranger", false, &[
        ("plain-http", &format!("\"--endpoints={plain}\", get, --prefix, /podlock/")),
        ("tls-no-user", &format!("\"--endpoints={ENDPOINTS}\", --insecure-transport=false, --insecure-skip-tls-verify, get, --prefix, /podlock/")),
        ("guessed-root", &format!("\"--endpoints={ENDPOINTS}\", --insecure-transport=false, --insecure-skip-tls-verify, \"--user=root:root\", get, --prefix, /podlock/")),
    ]));
    let insider = insider(node);
    let stranger = outcomes(node, "stranger");
    for (pod, results) in [
        ("insider (tenant's credentials)", &insider),
        ("stranger (no credentials)", &stranger),
    ] {
        for (container, (code, log)) in results {
            eprintln!(
                "{pod} {container}: exit {code}: {}",
                log.lines().last().unwrap_or("")
            );
        }
    }
    let (code, own) = &insider["own"];
    assert!(
        *code == 0 && own.contains("/podlock/v1/config/tenant/mine"),
        "tenant cannot read its own keys: {own}"
    );
    for c in ["read-app", "delete-app"] {
        let (code, log) = &insider[c];
        assert!(
            *code != 0 && log.contains("permission denied"),
            "{c}: exit {code}: {log}"
        );
    }
    // Refused by etcd itself, not merely unreachable: TLS, then auth.
    for (c, refusal) in [
        ("plain-http", "context deadline exceeded"),
        ("tls-no-user", "user name is empty"),
        ("guessed-root", "authentication failed"),
    ] {
        let (code, log) = &stranger[c];
        assert!(*code != 0 && log.contains(refusal), "{c}: exit {code}: {log}");
    }
    let (_, holder, _) = node.kubectl(&[
        "get",
        "dlock",
        "work",
        "-n",
        "app",
        "-o",
        "jsonpath={.status.holders[0].pod}",
    ]);
    assert!(!holder.is_empty(), "app's lock lost its holder");
    node.kubectl(&[
        "delete",
        "dlock",
        "mine",
        "-n",
        "tenant",
        "--wait=true",
        "--timeout=60s",
    ]);
    node.kubectl(&["delete", "namespace", "tenant", "--wait=false"]);
}
