//! The client examples in `examples/` run against a real sidecar and write to the fenced store.

use std::process::Command;

use crate::common::store::FencedStore;
use crate::common::{EtcdServer, Sidecar, declare};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");

#[tokio::test]
async fn the_curl_python_and_go_examples_take_the_lock_and_write_fenced() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["report"]);
    let s = Sidecar::start(&etcd.endpoint, "example-pod", &[]).await;
    let store = FencedStore::start().await;

    // (program, arguments, directory under examples/)
    let runs: [(&str, &[&str], &str); 3] = [
        ("bash", &["curl.sh"], ""),
        ("python3", &["python_client.py"], ""),
        ("go", &["run", "."], "go"),
    ];
    let mut tokens = vec![];
    for (program, args, dir) in runs {
        let out = Command::new(program)
            .args(args)
            .current_dir(format!("{EXAMPLES}/{dir}"))
            .env("PODLOCK_ADDR", &s.addr)
            .env("STORE_URL", &store.url)
            .env("PODLOCK_CONTAINER", "app") // as the injector sets it
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{program} {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("released"), "{program}: {stdout}");
        let token: i64 = stdout
            .lines()
            .find_map(|l| l.strip_prefix("acquired report with fencing token "))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("{program}: no token in {stdout}"));
        tokens.push(token);
        if program == "python3" {
            assert!(stdout.contains("as expected: lock_not_found"), "{stdout}");
        }
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens rise: {tokens:?}");
    let state = store.state().await;
    assert_eq!(
        (state["accepted"].as_u64(), state["rejected"].as_u64()),
        (Some(3), Some(0)),
        "{state}"
    );
    assert_eq!(
        s.get("/v1/locks/report").await.1["held"],
        false,
        "every example released"
    );
}
