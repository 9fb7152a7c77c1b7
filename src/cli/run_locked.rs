//! `podlock lock NAME -- CMD ARGS...`: runs CMD while holding NAME through the sidecar.
//!
//! It subscribes to the lock's events before acquiring, so a `lost` event can never slip by;
//! exports `PODLOCK_FENCING_TOKEN`; heartbeats when the hold has a window; sends CMD SIGTERM
//! when the hold is lost; releases when CMD exits and passes on CMD's exit status.

use clap::Args;
use futures::StreamExt;
use serde_json::{Value, json};
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

/// Exit status when the hold was lost while CMD ran.
pub const EXIT_LOST: i32 = 75;
/// Exit status when the lock could not be acquired.
pub const EXIT_NOT_ACQUIRED: i32 = 1;

/// Flags of `podlock lock`.
#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: CMD's own (128+N if killed by signal N); 1 if the lock could not be \
acquired; 75 if the hold was lost while CMD ran (CMD then got SIGTERM)."
)]
pub struct LockArgs {
    /// The lock's name.
    pub name: String,
    /// Seconds to wait for the lock (0: try once).
    #[arg(long, env = "PODLOCK_WAIT", default_value_t = 30.0)]
    pub wait: f64,
    /// The sidecar's address.
    #[arg(long, env = "PODLOCK_ADDR", default_value = "http://127.0.0.1:4040")]
    pub addr: String,
    /// Holder id to use (default: host name and process id, unique to this run).
    #[arg(long, env = "PODLOCK_HOLDER_ID")]
    pub holder_id: Option<String>,
    /// This app container's name (the injector sets PODLOCK_CONTAINER): the operator then ends
    /// the hold when this container restarts, not when another container of the pod does.
    #[arg(long, env = "PODLOCK_CONTAINER")]
    pub container: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// Runs `podlock lock`; returns the process exit status.
pub async fn run(args: LockArgs) -> anyhow::Result<i32> {
    let http = reqwest::Client::new();
    let base = format!("{}/v1/locks/{}", args.addr.trim_end_matches('/'), args.name);
    let holder = args.holder_id.clone().unwrap_or_else(default_holder);

    let (lost_tx, mut lost_rx) = mpsc::channel::<String>(1);
    let events = http.get(format!("{base}/events")).send().await?;
    if !events.status().is_success() {
        anyhow::bail!(
            "cannot subscribe to events of {}: {}",
            args.name,
            events.text().await?
        );
    }
    let mut options = json!({ "waitSeconds": args.wait, "holderId": holder });
    if let Some(c) = &args.container {
        options["container"] = json!(c);
    }
    let resp = http.post(format!("{base}/acquire")).json(&options).send().await?;
    let status = resp.status();
    let grant: Value = resp.json().await?;
    if !status.is_success() {
        eprintln!(
            "podlock: could not acquire {}: {}",
            args.name,
            grant["message"].as_str().unwrap_or("?")
        );
        return Ok(EXIT_NOT_ACQUIRED);
    }
    let token = grant["fencingToken"].as_i64().unwrap_or_default();
    tokio::spawn(watch_for_loss(events, holder.clone(), token, lost_tx));
    let heartbeat = grant["heartbeatTimeoutSeconds"].as_u64().unwrap_or(0);
    if heartbeat > 0 {
        tokio::spawn(keep_heartbeating(
            http.clone(),
            base.clone(),
            holder.clone(),
            heartbeat,
        ));
    }

    let mut child = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("PODLOCK_FENCING_TOKEN", token.to_string())
        .env("PODLOCK_LOCK", &args.name)
        .env("PODLOCK_HOLDER_ID", &holder)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {:?}: {e}", args.command[0]))?;
    let pid = child.id().map(|p| p as i32);
    let mut term = signal(SignalKind::terminate())?;
    let mut lost = None;
    let exit: ExitStatus = loop {
        tokio::select! {
            status = child.wait() => break status?,
            reason = lost_rx.recv(), if lost.is_none() => {
                let reason = reason.unwrap_or_else(|| "the sidecar's event stream ended".into());
                eprintln!("podlock: lost lock {} (token {token}): {reason}; sending SIGTERM", args.name);
                lost = Some(reason);
                send_sigterm(pid);
            }
            _ = term.recv() => send_sigterm(pid),
        }
    };
    if lost.is_some() {
        return Ok(EXIT_LOST);
    }
    let released = http
        .post(format!("{base}/release"))
        .json(&json!({ "holderId": holder }))
        .send()
        .await;
    if let Err(e) = released {
        eprintln!(
            "podlock: release of {} failed ({e}); the lease will end it",
            args.name
        );
    }
    Ok(exit_code(exit))
}

/// Reads the event stream until a `lost` event for our hold (or the stream's end).
async fn watch_for_loss(events: reqwest::Response, holder: String, token: i64, lost: mpsc::Sender<String>) {
    let mut stream = events.bytes_stream();
    let mut buf = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if let Some(reason) = lost_reason(&frame, &holder, token) {
                let _ = lost.send(reason).await;
                return;
            }
        }
    }
    let _ = lost.send("the sidecar's event stream ended".into()).await;
}

/// The reason of a `lost` event frame about `holder`'s hold `token`, if that is what it is.
fn lost_reason(frame: &str, holder: &str, token: i64) -> Option<String> {
    let data: String = frame
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .collect();
    let ev: Value = serde_json::from_str(&data).ok()?;
    let ours = ev["holderId"] == holder && ev["fencingToken"] == token;
    (ours && ev["type"] == "lost").then(|| ev["reason"].as_str().unwrap_or("unknown").to_string())
}

async fn keep_heartbeating(http: reqwest::Client, base: String, holder: String, window: u64) {
    let period = Duration::from_millis(window * 1000 / 3);
    loop {
        tokio::time::sleep(period).await;
        let _ = http
            .post(format!("{base}/heartbeat"))
            .json(&json!({ "holderId": holder }))
            .send()
            .await;
    }
}

fn send_sigterm(pid: Option<i32>) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) has no memory effects; pid is our own child's.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn default_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "podlock".into());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_our_lost_event() {
        let frame = "event: lost\ndata: {\"type\":\"lost\",\"holderId\":\"a\",\"fencingToken\":7,\"reason\":\"x\"}\n\n";
        assert_eq!(lost_reason(frame, "a", 7).as_deref(), Some("x"));
        assert_eq!(lost_reason(frame, "a", 8), None);
        assert_eq!(lost_reason(frame, "b", 7), None);
        let released = frame.replace("\"lost\"", "\"released\"");
        assert_eq!(lost_reason(&released, "a", 7), None);
    }
}
