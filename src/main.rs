//! `podlock`: fair, fenced, liveness-aware locks for Kubernetes pods, on etcd.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use podlock::cli::{declare, fence, observe, pre_uninstall, probe, run_locked};
use podlock::{operator, sidecar};

#[derive(Parser)]
#[command(
    name = "podlock",
    version,
    about = "Fair, fenced, liveness-aware locks for Kubernetes pods"
)]
struct Cli {
    /// Log format: text or json.
    #[arg(long, env = "PODLOCK_LOG_FORMAT", default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the lock HTTP API for one pod (on loopback).
    Sidecar(sidecar::SidecarArgs),
    /// Write a lock's settings to etcd, as the operator does for a DistributedLock.
    Declare(declare::DeclareArgs),
    /// Run a command while holding a lock through the sidecar.
    Lock(run_locked::LockArgs),
    /// Ask the sidecar whether a fencing token is still a current hold of a lock.
    Fence(fence::FenceArgs),
    /// Follow who holds a lock through the sidecar, a line per change, until it is deleted.
    Observe(observe::ObserveArgs),
    /// Reconcile DistributedLock objects with etcd.
    Operator(Box<operator::OperatorArgs>),
    /// Print the DistributedLock CRD as YAML (what crds/ holds).
    Crd,
    /// Check that a sidecar's API serves (its injected startup and readiness probe).
    Probe(probe::ProbeArgs),
    /// Stop the operator and remove its finalizer from every DistributedLock (the chart's
    /// pre-delete hook, before `helm uninstall` deletes anything).
    PreUninstall(pre_uninstall::PreUninstallArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("PODLOCK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    // One thread for every command. A sidecar serves one pod: one thread does it with less CPU
    // and memory, and no cross-thread wake-ups on the lock's hot path. The operator too: with a
    // thread per core it spent about a third of its CPU waking and parking threads (futex,
    // the scheduler), and took 2.2 to 2.5 s of CPU to bring 1,000 locks Ready against 1.4 to
    // 1.6 s on one thread, as fast (bench/README.md, "The operator's CPU").
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Sidecar(args) => sidecar::run(args).await,
            Command::Declare(args) => declare::run(args).await,
            Command::Probe(args) => probe::run(args).await,
            Command::PreUninstall(args) => Ok(pre_uninstall::run(args).await?),
            Command::Operator(args) => operator::run(*args).await,
            Command::Crd => {
                print!("{}", podlock::crd::crd_yaml());
                Ok(())
            }
            Command::Fence(args) => std::process::exit(fence::run(args).await),
            Command::Observe(args) => std::process::exit(observe::run(args).await),
            Command::Lock(args) => {
                let code = run_locked::run(args).await?;
                std::process::exit(code)
            }
        }
    })
}
