//! `podlock observe NAME`: follows who holds lock NAME through the sidecar
//! (`GET /v1/locks/{name}/watch`), a line per change of its holders, until the lock is deleted.
//! For a person at a terminal, or a script that reacts to a new holder (`--json`).

use anyhow::Context;
use clap::Args;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::Value;
use std::time::Duration;

/// Exit status when the lock was deleted: the end of what there is to observe.
pub const EXIT_DELETED: i32 = 0;
/// Exit status on any other end: a bad name, a lock not declared, the sidecar or etcd
/// unreachable at the start, the stream cut.
pub const EXIT_FAILED: i32 = 1;

/// How long reaching the sidecar may take (the stream itself has no time limit).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of `podlock observe`.
#[derive(Debug, Args)]
#[command(
    after_help = "Prints a line for the holders now, then one at each change of them (holder \
ids, tokens, modes), and a last one when the lock is deleted. Exit status: 0 when the lock is \
deleted; 1 otherwise (the reason on stderr)."
)]
pub struct ObserveArgs {
    /// The lock's name.
    pub name: String,
    /// Print each event's data as the sidecar sends it, one JSON object a line (the last one,
    /// without `holders`, is the lock's deletion).
    #[arg(long)]
    pub json: bool,
    /// The sidecar's address.
    #[arg(long, env = "PODLOCK_ADDR", default_value = "http://127.0.0.1:4040")]
    pub addr: String,
}

/// Runs `podlock observe`; returns the process exit status.
pub async fn run(args: ObserveArgs) -> i32 {
    match follow(&args).await {
        Ok(()) => EXIT_DELETED,
        Err(e) => {
            eprintln!("podlock observe: {e:#}");
            EXIT_FAILED
        }
    }
}

/// Prints the stream's events until the lock's deletion (`Ok`), or says why it ended before.
async fn follow(args: &ObserveArgs) -> anyhow::Result<()> {
    let url = format!("{}/v1/locks/{}/watch", args.addr.trim_end_matches('/'), args.name);
    let http = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()?;
    let resp = http.get(&url).send().await.with_context(|| url.clone())?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        anyhow::bail!("{url} answered {status}: {body}");
    }
    let mut events = resp.bytes_stream().eventsource();
    while let Some(event) = events.next().await {
        let event = event.with_context(|| format!("the stream of {url} broke"))?;
        let data: Value =
            serde_json::from_str(&event.data).with_context(|| format!("{url} sent {:?}", event.data))?;
        let deleted = event.event == "deleted";
        // Events of later versions are not for this one to print.
        if deleted || event.event == "holders" {
            println!("{}", if args.json { event.data } else { line(&data) });
        }
        if deleted {
            return Ok(());
        }
    }
    anyhow::bail!("the sidecar ended the stream of {url} before the lock was deleted")
}

/// A person's line for an event's data: who holds at which revision, or that the lock is gone.
fn line(data: &Value) -> String {
    let revision = &data["revision"];
    let Some(holders) = data["holders"].as_array() else {
        return format!(
            "revision {revision}: lock {} deleted",
            data["lock"].as_str().unwrap_or("?")
        );
    };
    if holders.is_empty() {
        return format!("revision {revision}: free");
    }
    let each: Vec<String> = (holders.iter())
        .map(|h| {
            let id = h["holderId"].as_str().unwrap_or("?");
            let pod = h["pod"].as_str().unwrap_or("?");
            let mode = h["mode"].as_str().unwrap_or("?");
            // A weighted hold says how many slots it takes; one slot goes without saying.
            let permits = match h["permits"].as_u64() {
                Some(n) if n > 1 => format!(", {n} permits"),
                _ => String::new(),
            };
            format!("{id} (pod {pod}, token {}, {mode}{permits})", h["fencingToken"])
        })
        .collect();
    format!("revision {revision}: held by {}", each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_line_names_each_holder_or_says_free_or_deleted() {
        let holder = |id: &str, token: i64| {
            json!({"holderId": id, "pod": "web-1", "fencingToken": token, "mode": "shared",
                "acquiredAt": "2026-11-28T10:00:00.000Z"})
        };
        let held = json!({"lock": "db", "namespace": "default", "revision": 9,
            "holders": [holder("r1", 7), holder("r2", 8)]});
        assert_eq!(
            line(&held),
            "revision 9: held by r1 (pod web-1, token 7, shared), r2 (pod web-1, token 8, shared)"
        );
        let mut weighted = holder("w", 9);
        (weighted["mode"], weighted["permits"]) = (json!("exclusive"), json!(2));
        let one = json!({"revision": 9, "holders": [weighted]});
        assert_eq!(
            line(&one),
            "revision 9: held by w (pod web-1, token 9, exclusive, 2 permits)"
        );
        let free = json!({"lock": "db", "namespace": "default", "revision": 10, "holders": []});
        assert_eq!(line(&free), "revision 10: free");
        let gone = json!({"lock": "db", "namespace": "default", "revision": 11});
        assert_eq!(line(&gone), "revision 11: lock db deleted");
    }
}
