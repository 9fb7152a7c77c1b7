//! The simulated etcd's faults, which a single real etcd process cannot be compared on step by
//! step: a restore with `--bump-revision --mark-compacted`, a wipe, a leader change. Checked on
//! paused time against what etcd does (tests/integration/etcd_rebuild.rs and clusters_wiped.rs
//! show the real ones to podlock).

use etcd_client::{Client, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use podlock_sim::etcd::{Config, Etcd};
use std::time::Duration;

/// Runs every fault check; says what was checked.
pub fn check() -> Result<String, String> {
    let runtime = podlock_sim::paused_runtime();
    runtime.block_on(async {
        restore().await?;
        leader_change().await?;
        wipe().await?;
        would_panic().await?;
        Ok(
            "sim: restore with --bump-revision --mark-compacted, leader change and wipe behave as \
            etcd's; the transaction that panics etcd is refused"
                .into(),
        )
    })
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

async fn revision(c: &mut Client) -> i64 {
    let a = c
        .get("/", Some(GetOptions::new().with_count_only()))
        .await
        .expect("a read");
    a.header().expect("a header").revision()
}

async fn restore() -> Result<(), String> {
    let sim = Etcd::start(Config::default());
    let mut c = sim.client().await;
    c.put("/k", "before", None).await.expect("a put");
    let snapshot = sim.snapshot();
    c.put("/k", "lost", None).await.expect("a put");
    let mut watch = c.watch("/k", None).await.expect("a watch");
    watch.message().await.expect("created");
    sim.restore(&snapshot, 1_000, true);
    // The revision is the snapshot's plus the bump, compacted there: a read of any earlier
    // revision fails, a watch from one is cancelled, and the streams open before it broke.
    expect("revision after restore", revision(&mut c).await, 1_002)?;
    let old = c.get("/k", Some(GetOptions::new().with_revision(2))).await;
    let old = old.err().map(|e| e.to_string());
    expect(
        "a read before the bump",
        old.is_some_and(|e| e.contains("compacted")),
        true,
    )?;
    let kv = c.get("/k", None).await.expect("a read");
    expect("the value restored", kv.kvs()[0].value(), b"before".as_slice())?;
    expect("an open stream", watch.message().await.is_err(), true)?;
    let mut from_old = c
        .watch("/k", Some(WatchOptions::new().with_start_revision(2)))
        .await
        .expect("a watch");
    from_old.message().await.expect("created");
    let cancelled = from_old
        .message()
        .await
        .expect("an answer")
        .expect("an open stream");
    expect("a watch from before", cancelled.compact_revision(), 1_002)
}

async fn leader_change() -> Result<(), String> {
    let sim = Etcd::start(Config::default());
    let mut c = sim.client().await;
    let lease = c.lease_grant(10, None).await.expect("a grant").id();
    c.put("/k", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("a put");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let term = |c: &etcd_client::LeaseTimeToLiveResponse| c.header().expect("a header").raft_term();
    let before = c.lease_time_to_live(lease, None).await.expect("a TTL");
    sim.change_leader();
    // The new leader's lessor starts every lease's TTL again plus the election timeout (1 s).
    let after = c.lease_time_to_live(lease, None).await.expect("a TTL");
    expect("TTL left before and after", (before.ttl(), after.ttl()), (2, 11))?;
    expect("a new term", term(&after), term(&before) + 1)?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let gone = c
        .get("/k", Some(GetOptions::new().with_count_only()))
        .await
        .expect("a read");
    expect("keys of the expired lease", gone.count(), 0)?;
    checkpointed().await
}

/// A lease longer than etcd's checkpoint interval (300 s) is checkpointed 300 and 600 s after
/// its grant; a new leader at 650 s gives it what was left at 600 s (plus the election timeout),
/// where it gives a short lease its whole TTL again.
async fn checkpointed() -> Result<(), String> {
    let sim = Etcd::start(Config::default());
    let mut c = sim.client().await;
    let long = c.lease_grant(1000, None).await.expect("a grant").id();
    tokio::time::sleep(Duration::from_secs(640)).await;
    let short = c.lease_grant(15, None).await.expect("a grant").id();
    tokio::time::sleep(Duration::from_secs(10)).await;
    sim.change_leader();
    let mut left = async |id| c.lease_time_to_live(id, None).await.expect("a TTL").ttl();
    expect(
        "TTL left after the leader change",
        (left(long).await, left(short).await),
        (401, 16),
    )
}

async fn wipe() -> Result<(), String> {
    let sim = Etcd::start(Config::default());
    let mut c = sim.client().await;
    c.put("/k", "v", None).await.expect("a put");
    c.lease_grant(60, None).await.expect("a grant");
    sim.wipe();
    expect("revision after a wipe", revision(&mut c).await, 1)?;
    expect(
        "leases after a wipe",
        c.leases().await.expect("leases").leases().len(),
        0,
    )
}

/// etcd 3.5.17 panics on this transaction (docs/design.md, "The simulated etcd"): refused, and
/// nothing of it written.
async fn would_panic() -> Result<(), String> {
    let sim = Etcd::start(Config::default());
    let mut c = sim.client().await;
    c.put("/d/k6", "v", None).await.expect("a put");
    let txn = Txn::new().and_then([
        TxnOp::delete("/d/k2", Some(DeleteOptions::new().with_from_key())),
        TxnOp::put("/d/k6", "v3", Some(PutOptions::new().with_ignore_lease())),
    ]);
    let refused = c.txn(txn).await.err().map(|e| e.to_string());
    expect("refused", refused.is_some_and(|e| e.contains("panics")), true)?;
    expect("revision after", revision(&mut c).await, 2)
}
