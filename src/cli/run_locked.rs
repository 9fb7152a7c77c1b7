//! `podlock lock NAME [NAME...] -- CMD ARGS...`: runs CMD while holding NAME (and every further
//! NAME, taken as one: a multi-lock acquire) through the sidecar.
//!
//! The hold is bound to its connection (`POST .../hold`): its answer streams the grant and
//! then the hold's end, so a `lost` can never slip by, and if this process dies (kill -9, OOM)
//! the sidecar releases the hold at once; CMD is then sent SIGTERM by the kernel (it never
//! outlives the hold's process). It exports `PODLOCK_FENCING_TOKEN`; sends CMD SIGTERM when the
//! hold is lost (a `lost` event, or the stream ending); releases when CMD exits and passes on
//! CMD's exit status, unless the release finds the hold already lost. A hold with a maximum
//! hold time (`--max-hold-seconds`, or the lock's) sends CMD SIGTERM at its `deadline` warning, and
//! SIGKILL at the deadline itself (the hold is gone: CMD must not run on unprotected). A
//! request to yield (`podlock.io/yield` on the lock) is passed on the same way: SIGTERM at the
//! `yield` event, SIGKILL if the operator ends the hold at the request's deadline.

use clap::Args;
use futures::StreamExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use std::process::ExitStatus;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::lock::{DEADLINE, YIELD};
use sidecar::{HoldEvents, Released, Sidecar};

mod sidecar;

/// Exit status when the hold was lost while CMD ran.
pub const EXIT_LOST: i32 = 75;
/// Exit status when the lock could not be acquired.
pub const EXIT_NOT_ACQUIRED: i32 = 1;

/// Flags of `podlock lock`.
#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: CMD's own (128+N if killed by signal N); 1 if the lock could not be \
acquired; 75 if the hold was lost while CMD ran (CMD then got SIGTERM; SIGKILL at a deadline \
or at the deadline of a request to yield)."
)]
pub struct LockArgs {
    /// The lock's name.
    pub name: String,
    /// Further locks to hold with it, taken as one (a multi-lock acquire: FIFO on each, no
    /// deadlock whatever the order).
    pub with: Vec<String>,
    /// Seconds to wait for the lock (0: try once).
    #[arg(long, env = "PODLOCK_WAIT", default_value_t = 30.0)]
    pub wait: f64,
    /// The sidecar's address.
    #[arg(long, env = "PODLOCK_ADDR", default_value = "http://127.0.0.1:4040")]
    pub addr: String,
    /// Holder id to use (default: the host name and a random suffix, unique to this process).
    /// Inside another `podlock lock`'s command, the id that one exported is not taken: each run
    /// is a holder of its own.
    #[arg(long, env = "PODLOCK_HOLDER_ID")]
    pub holder_id: Option<String>,
    /// The longest the hold may last, in seconds (at most the lock's maxHoldSeconds; default:
    /// the lock's). CMD gets SIGTERM at the deadline's warning and SIGKILL at the deadline.
    // Named as `declare --max-hold-seconds` and the API's field; the old name, unlisted, is
    // still taken so that scripts written for it go on working.
    #[arg(
        long,
        alias = "max-hold",
        env = "PODLOCK_MAX_HOLD_SECONDS",
        value_name = "SECONDS"
    )]
    pub max_hold_seconds: Option<u32>,
    /// How long before the deadline CMD gets SIGTERM, in seconds (default: a tenth of the hold,
    /// at least 1).
    // The old name, without `-seconds`, unlisted, is still taken.
    #[arg(
        long,
        alias = "deadline-warning",
        env = "PODLOCK_DEADLINE_WARNING_SECONDS",
        value_name = "SECONDS"
    )]
    pub deadline_warning_seconds: Option<u32>,
    /// How many of the lock's slots to hold (a weighted semaphore; default 1, at most its
    /// maxHolders). The lock is granted once that many are free and every request ahead of this
    /// one is granted: FIFO, a larger request is not passed.
    #[arg(long, env = "PODLOCK_PERMITS", value_name = "N")]
    pub permits: Option<u32>,
    /// This app container's name (the injector sets PODLOCK_CONTAINER): the operator then ends
    /// the hold when this container restarts, not when another container of the pod does.
    #[arg(long, env = "PODLOCK_CONTAINER")]
    pub container: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

impl LockArgs {
    /// The locks held, as CMD is told them (`PODLOCK_LOCK`): their names, comma-separated.
    fn names(&self) -> String {
        std::iter::once(&self.name)
            .chain(&self.with)
            .cloned()
            .collect::<Vec<_>>()
            .join(",")
    }

    /// What `POST .../hold` asks, for `holder`.
    fn options(&self, holder: &str) -> Value {
        let mut options = json!({ "waitSeconds": self.wait, "holderId": holder });
        if let Some(c) = &self.container {
            options["container"] = json!(c);
        }
        if !self.with.is_empty() {
            options["with"] = json!(self.with);
        }
        if let Some(seconds) = self.max_hold_seconds {
            options["maxHoldSeconds"] = json!(seconds);
        }
        if let Some(n) = self.permits {
            options["permits"] = json!(n);
        }
        if let Some(seconds) = self.deadline_warning_seconds {
            options["deadlineWarningSeconds"] = json!(seconds);
        }
        options
    }
}

/// Runs `podlock lock`: subscribe, acquire, run CMD under the hold, release; returns the
/// process exit status.
pub async fn run(args: LockArgs) -> anyhow::Result<i32> {
    let holder = own_holder_id(&args).unwrap_or_else(default_holder);
    let sidecar = Sidecar::new(&args.addr, &args.name, holder);
    let options = args.options(sidecar.holder());
    let Some((grant, events)) = sidecar.hold(&options, &args.names()).await? else {
        return Ok(EXIT_NOT_ACQUIRED);
    };
    let token = grant["fencingToken"].as_i64().unwrap_or_default();
    let (notices, notices_rx) = mpsc::channel::<Notice>(1);
    tokio::spawn(watch_hold(events, notices));
    let child = command(&args, sidecar.holder(), token)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {:?}: {e}", args.command[0]))?;
    let Some(exit) = supervise(child, notices_rx, &args.name, token).await? else {
        return Ok(EXIT_LOST);
    };
    Ok(match sidecar.release(&args.name).await {
        Released::Lost => EXIT_LOST,
        Released::Yes | Released::Unknown => exit_code(exit),
    })
}

/// CMD, told its hold, and sent SIGTERM by the kernel if this process dies first (its hold is
/// then released: CMD must not run on unprotected).
fn command(args: &LockArgs, holder: &str, token: i64) -> Command {
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("PODLOCK_FENCING_TOKEN", token.to_string())
        .env("PODLOCK_LOCK", args.names())
        .env("PODLOCK_HOLDER_ID", holder);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent. The runtime is
    // single-threaded, so the thread it watches is the process's.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    cmd
}

/// What the hold's stream tells CMD's supervisor.
#[derive(Debug, PartialEq, Eq)]
enum Notice {
    /// The hold's deadline is near (the RFC 3339 time given): CMD is asked to stop.
    Deadline(String),
    /// An administrator asked the hold to yield by the RFC 3339 time given: CMD is asked to stop.
    Yield(String),
    /// The hold ended, for this reason.
    Ended(String),
}

/// Waits for CMD to exit, passing SIGTERM on; sends it SIGTERM at a deadline's warning, a
/// request to yield, or if the hold is lost, SIGKILL if the hold reached its deadline (or a
/// request's); returns its exit status, or
/// `None` if the hold ended meanwhile.
async fn supervise(
    mut child: Child,
    mut notices: mpsc::Receiver<Notice>,
    name: &str,
    token: i64,
) -> anyhow::Result<Option<ExitStatus>> {
    let pid = child.id().map(|p| Pid::from_raw(p as i32));
    let mut term = signal(SignalKind::terminate())?;
    let mut ended = false;
    loop {
        tokio::select! {
            status = child.wait() => return Ok((!ended).then_some(status?)),
            notice = notices.recv(), if !ended => {
                let gone = || Notice::Ended("the sidecar's event stream ended".into());
                let (what, sig) = match notice.unwrap_or_else(gone) {
                    Notice::Deadline(at) => (format!("its deadline is at {at}"), Signal::SIGTERM),
                    Notice::Yield(at) => (format!("asked to yield by {at}"), Signal::SIGTERM),
                    Notice::Ended(reason) => {
                        ended = true;
                        let at_deadline = reason == DEADLINE || reason == YIELD;
                        let sig = if at_deadline { Signal::SIGKILL } else { Signal::SIGTERM };
                        (format!("lost: {reason}"), sig)
                    }
                };
                eprintln!("podlock: lock {name} (token {token}): {what}; sending {sig}");
                send(pid, sig);
            }
            _ = term.recv() => send(pid, Signal::SIGTERM),
        }
    }
}

/// Reads the hold's stream: passes on a deadline's warning and a request to yield, and ends when the stream says the
/// hold ended (`lost`, or `released` by someone else), or ends: then the hold is gone.
async fn watch_hold(mut events: HoldEvents, notices: mpsc::Sender<Notice>) {
    while let Some(Ok(event)) = events.next().await {
        match notice(&event.event, &event.data) {
            Some(warning @ (Notice::Deadline(_) | Notice::Yield(_))) => {
                let _ = notices.send(warning).await;
            }
            Some(ended) => {
                let _ = notices.send(ended).await;
                return;
            }
            None => {}
        }
    }
    let _ = notices
        .send(Notice::Ended("the sidecar closed the hold's stream".into()))
        .await;
}

/// What the hold stream's event `kind` with JSON `data` tells, if anything.
fn notice(kind: &str, data: &str) -> Option<Notice> {
    let ev: Value = serde_json::from_str(data).ok()?;
    let field = |f: &str| ev[f].as_str().unwrap_or("unknown").to_string();
    match kind {
        "deadline" => Some(Notice::Deadline(field("deadline"))),
        "yield" => Some(Notice::Yield(field("deadline"))),
        "lost" => Some(Notice::Ended(field("reason"))),
        "released" => Some(Notice::Ended(
            "released by another request of the same holder".into(),
        )),
        _ => None,
    }
}

fn send(pid: Option<Pid>, sig: Signal) {
    if let Some(pid) = pid {
        let _ = kill(pid, sig);
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The holder id asked for, unless it is the one an enclosing `podlock lock` exported to its
/// command (`PODLOCK_HOLDER_ID` beside its `PODLOCK_LOCK`): taken over, a nested run would act
/// as the outer one's holder.
fn own_holder_id(args: &LockArgs) -> Option<String> {
    let inherited = std::env::var_os("PODLOCK_LOCK").is_some()
        && std::env::var("PODLOCK_HOLDER_ID").ok() == args.holder_id;
    args.holder_id.clone().filter(|_| !inherited)
}

/// A holder id of this process alone: the hostname (the pod's name) and a random suffix, as
/// containers of one pod share the hostname and may each run their command as PID 1.
fn default_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "podlock".into());
    crate::lock::unique_holder_id(&host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        lock: LockArgs,
    }

    #[test]
    fn the_seconds_flags_have_one_name_and_take_their_old_one_unlisted() {
        let parse = |args: &[&str]| {
            let argv = ["podlock", "job"].iter().chain(args).chain(&["--", "true"]);
            Flags::try_parse_from(argv).unwrap().lock
        };
        for args in [
            ["--max-hold-seconds", "60", "--deadline-warning-seconds", "5"],
            ["--max-hold", "60", "--deadline-warning", "5"],
        ] {
            let lock = parse(&args);
            assert_eq!(
                (lock.max_hold_seconds, lock.deadline_warning_seconds),
                (Some(60), Some(5))
            );
        }
        let help = Flags::command().render_long_help().to_string();
        assert!(
            help.contains("--max-hold-seconds") && !help.contains("--max-hold "),
            "{help}"
        );
        assert!(!help.contains("--deadline-warning "), "{help}");
    }

    #[test]
    fn the_hold_ends_with_lost_or_someone_elses_release() {
        let data = r#"{"type":"lost","holderId":"a","fencingToken":7,"reason":"x"}"#;
        assert_eq!(notice("lost", data), Some(Notice::Ended("x".into())));
        assert!(matches!(notice("released", data), Some(Notice::Ended(_))));
        assert_eq!(notice("acquired", data), None);
    }

    #[test]
    fn a_deadline_warning_names_the_deadline_and_ends_nothing() {
        let data = r#"{"type":"deadline","fencingToken":7,"deadline":"2026-11-28T10:00:00.000Z"}"#;
        let told = notice("deadline", data);
        assert_eq!(told, Some(Notice::Deadline("2026-11-28T10:00:00.000Z".into())));
    }

    #[test]
    fn a_request_to_yield_names_its_deadline_and_ends_nothing() {
        let data = r#"{"type":"yield","fencingToken":7,"deadline":"2026-11-28T10:00:30.000Z"}"#;
        let told = notice("yield", data);
        assert_eq!(told, Some(Notice::Yield("2026-11-28T10:00:30.000Z".into())));
    }
}
