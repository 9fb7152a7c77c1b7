//! `podlock fence NAME TOKEN`: asks the sidecar whether TOKEN is a current hold of lock NAME
//! (`GET /v1/locks/{name}/fence`), prints its answer and says it in the exit status, for a
//! script that must check a token before it commits.

use clap::Args;
use serde_json::Value;
use std::time::Duration;

/// Exit status when the token is a current hold.
pub const EXIT_CURRENT: i32 = 0;
/// Exit status when the token is not a current hold (the answer names the current ones).
pub const EXIT_NOT_CURRENT: i32 = 1;
/// Exit status when there is no answer: a bad request, the sidecar or etcd unreachable.
pub const EXIT_NO_ANSWER: i32 = 2;

/// How long the sidecar may take to answer (etcd's own budget for a read is 5 s).
const TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of `podlock fence`.
#[derive(Debug, Args)]
#[command(
    after_help = "Prints the sidecar's answer (JSON) on stdout. Exit status: 0 if TOKEN \
is a current hold of NAME, as of the etcd revision in the answer; 1 if it is not (the answer's \
holders are the current ones); 2 if there is no answer (bad input, sidecar or etcd unreachable)."
)]
pub struct FenceArgs {
    /// The lock's name.
    pub name: String,
    /// The fencing token to check (a grant's fencingToken, `$PODLOCK_FENCING_TOKEN` under
    /// `podlock lock`).
    pub token: String,
    /// The sidecar's address.
    #[arg(long, env = "PODLOCK_ADDR", default_value = "http://127.0.0.1:4040")]
    pub addr: String,
}

/// Runs `podlock fence`; returns the process exit status.
pub async fn run(args: FenceArgs) -> i32 {
    match ask(&args).await {
        Ok(answer) => {
            println!("{answer}");
            match answer["current"].as_bool() {
                Some(true) => EXIT_CURRENT,
                _ => EXIT_NOT_CURRENT,
            }
        }
        Err(e) => {
            eprintln!("podlock fence: {e:#}");
            EXIT_NO_ANSWER
        }
    }
}

/// The sidecar's 200 answer, or why there is none (its JSON error on any other status).
async fn ask(args: &FenceArgs) -> anyhow::Result<Value> {
    let url = format!("{}/v1/locks/{}/fence", args.addr.trim_end_matches('/'), args.name);
    let resp = reqwest::Client::new()
        .get(&url)
        .query(&[("token", &args.token)])
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| anyhow::Error::new(e).context(url.clone()))?;
    let status = resp.status();
    let body = resp.text().await?;
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}: {body}");
    }
    serde_json::from_str(&body).map_err(|e| anyhow::anyhow!("{url} answered {body:?}: {e}"))
}
