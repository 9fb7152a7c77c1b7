use super::*;
use crate::crd::Holder;

fn id(name: &str) -> LockId {
    LockId::new("ns", name).unwrap()
}

fn held(holder: &str, waiters: u32) -> DistributedLockStatus {
    DistributedLockStatus {
        phase: Some("Held".into()),
        holders: vec![Holder {
            holder_id: holder.into(),
            pod: format!("pod-{holder}"),
            cluster: None,
            // One token per holder: each is another grant.
            fencing_token: holder.bytes().map(i64::from).sum(),
            acquired_at: "2026-01-01T00:00:00Z".into(),
            mode: "exclusive".into(),
            yield_deadline: None,
            permits: 1,
        }],
        holder_count: 1,
        waiters,
        ..Default::default()
    }
}

fn offer(
    w: &mut Writes,
    name: &str,
    cached: &DistributedLockStatus,
    status: DistributedLockStatus,
    at: Instant,
) -> bool {
    w.offer(&id(name), ObjectReference::default(), cached, status, at)
}

fn written(w: &mut Writes, name: &str, status: &DistributedLockStatus, took: Duration, now: Instant) {
    let ended = Ended {
        took,
        now,
        retry: None,
    };
    w.done(&id(name), status, Outcome::Written, ended);
}

#[test]
fn the_interval_grows_with_the_patch_time_up_to_a_cap() {
    assert_eq!(interval(Duration::ZERO), Duration::ZERO);
    assert_eq!(interval(Duration::from_millis(25)), Duration::from_millis(100));
    assert_eq!(interval(Duration::from_millis(70)), Duration::from_millis(280));
    assert_eq!(interval(Duration::from_secs(3)), MAX_INTERVAL);
    let avg = smoothed(Some(Duration::from_millis(100)), Duration::from_millis(200));
    assert_eq!(avg, Duration::from_millis(120));
}

#[test]
fn a_newer_status_replaces_the_pending_one_and_keeps_its_place() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    assert!(offer(&mut w, "l", &cached, held("a", 1), t0));
    assert!(offer(
        &mut w,
        "m",
        &cached,
        held("a", 1),
        t0 + Duration::from_millis(1)
    ));
    assert!(offer(
        &mut w,
        "l",
        &cached,
        held("a", 5),
        t0 + Duration::from_millis(2)
    ));
    assert_eq!(w.pending(), 2, "one slot per lock");
    let (first, p) = w.take(t0 + Duration::from_millis(3)).unwrap();
    assert_eq!(
        (first, p.status.waiters),
        (id("l"), 5),
        "the latest state, in its first place"
    );
    // Back to what is shown: nothing left to write.
    assert!(!offer(&mut w, "m", &cached, cached.clone(), t0));
    assert!(w.take(t0 + Duration::from_millis(4)).is_err());
}

#[test]
fn holder_changes_go_before_waiter_counts_until_those_starve() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "waiters", &cached, held("a", 3), t0);
    offer(
        &mut w,
        "holder",
        &cached,
        held("b", 0),
        t0 + Duration::from_millis(10),
    );
    let now = t0 + Duration::from_millis(20);
    let (first, p) = w.take(now).unwrap();
    assert_eq!(first, id("holder"));
    assert!(p.first_changed, "a HolderChanged Event is due");
    written(&mut w, "holder", &p.status, Duration::from_millis(10), now);

    // A waiter count that waited past STARVED goes before a fresh holder change.
    offer(&mut w, "holder2", &cached, held("c", 0), t0 + STARVED);
    let (first, _) = w.take(t0 + STARVED).unwrap();
    assert_eq!(first, id("waiters"));
}

#[test]
fn a_lock_is_written_again_only_after_its_interval_unless_its_holder_changed() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("b", 0), t0);
    let (_, p) = w.take(t0).unwrap();
    assert!(
        offer(&mut w, "l", &cached, held("b", 2), t0),
        "a change while writing is kept"
    );
    assert!(w.take(t0).is_err(), "one write of a lock at a time");
    let took = Duration::from_millis(100);
    written(&mut w, "l", &p.status, took, t0 + took);
    // 100 ms PATCHes: 400 ms between two writes of the lock, counted from the last start.
    assert_eq!(w.take(t0 + took), Err(Some(t0 + interval(took))));
    let (_, p) = w.take(t0 + interval(took)).unwrap();
    assert_eq!(p.status.waiters, 2);
    // A new holder goes as soon as the write under way has landed.
    let t1 = t0 + interval(took);
    offer(&mut w, "l", &cached, held("c", 1), t1);
    assert!(w.take(t1).is_err(), "one write of a lock at a time");
    written(&mut w, "l", &p.status, took, t1 + took);
    let (_, p) = w.take(t1 + took).unwrap();
    assert_eq!(p.status.holders[0].holder_id, "c");
}

#[test]
fn the_latest_state_is_written_unless_both_the_cache_and_the_last_write_show_it() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let (a, b) = (held("a", 0), held("b", 0));
    offer(&mut w, "l", &a, b.clone(), t0);
    let (_, p) = w.take(t0).unwrap();
    assert!(!offer(&mut w, "l", &a, b.clone(), t0), "b is being written");
    written(&mut w, "l", &p.status, Duration::ZERO, t0);
    // The cache still shows a: back to a is a change (b is shown).
    assert!(offer(&mut w, "l", &a, a.clone(), t0));
    // Someone else wrote x over b: b is written again.
    assert!(offer(&mut w, "l", &held("x", 7), b.clone(), t0));
    assert!(
        !offer(&mut w, "l", &b, b.clone(), t0),
        "cache and last write show b"
    );
    assert_eq!(w.pending(), 0);
}

#[test]
fn a_failed_write_comes_back_after_its_pause_unless_a_newer_one_came() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("b", 0), t0);
    let (_, p) = w.take(t0).unwrap();
    let pause = Duration::from_secs(1);
    let ended = Ended {
        took: Duration::ZERO,
        now: t0,
        retry: Some(p.clone()),
    };
    w.done(&id("l"), &p.status, Outcome::Failed(pause), ended);
    assert_eq!(w.take(t0), Err(Some(t0 + pause)));
    let (_, again) = w.take(t0 + pause).unwrap();
    assert_eq!(again.status, p.status);
    let ended = Ended {
        took: Duration::ZERO,
        now: t0,
        retry: None,
    };
    w.done(&id("l"), &again.status, Outcome::Gone, ended);
    assert!(!offer(&mut w, "l", &cached, cached.clone(), t0));
    assert_eq!(w.pending(), 0);
}

#[test]
fn a_fencing_epoch_written_is_never_taken_back() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("b", 0), t0);
    // A new epoch is recorded outside the slots while the older status waits in its slot.
    let mut record = DistributedLockStatus {
        fencing_epoch: Some(2),
        ..cached.clone()
    };
    assert!(w.begin(&id("l"), &mut record, t0));
    assert!(w.take(t0).is_err(), "not while the record is under way");
    let mut other = record.clone();
    assert!(
        !w.begin(&id("l"), &mut other, t0),
        "one write of a lock at a time"
    );
    written(&mut w, "l", &record, Duration::ZERO, t0);
    let (_, p) = w.take(t0).unwrap();
    assert_eq!(
        (p.status.holders[0].holder_id.as_str(), p.status.fencing_epoch),
        ("b", Some(2))
    );
}

#[test]
fn a_waiter_count_after_a_holders_write_is_not_a_holder_change_though_the_cache_lags() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("b", 0), t0);
    let (_, p) = w.take(t0).unwrap();
    // The releaser queues again while b's write is under way; the cache still shows a.
    offer(&mut w, "l", &cached, held("b", 1), t0 + Duration::from_millis(1));
    offer(&mut w, "m", &cached, held("c", 0), t0 + Duration::from_millis(2));
    written(
        &mut w,
        "l",
        &p.status,
        Duration::ZERO,
        t0 + Duration::from_millis(3),
    );
    let (first, _) = w.take(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(first, id("m"), "the holder change goes first");
}

#[test]
fn after_a_failed_write_holders_are_compared_with_the_cache() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("b", 0), t0);
    let (_, p) = w.take(t0).unwrap();
    let ended = Ended {
        took: Duration::ZERO,
        now: t0,
        retry: None,
    };
    w.done(&id("l"), &p.status, Outcome::Failed(Duration::ZERO), ended);
    offer(&mut w, "m", &cached, held("a", 4), t0);
    offer(&mut w, "l", &cached, held("b", 1), t0 + Duration::from_millis(1));
    let (first, _) = w.take(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(first, id("l"), "b may not be shown: still a holder change");
}

#[test]
fn a_holders_acquired_at_recorded_after_its_write_is_not_a_holder_change() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("b", 0), t0);
    let (_, p) = w.take(t0).unwrap();
    written(&mut w, "l", &p.status, Duration::ZERO, t0);
    let mut marked = held("b", 0);
    marked.holders[0].acquired_at = "2026-01-01T00:00:00.030Z".into();
    offer(&mut w, "l", &cached, marked, t0 + Duration::from_millis(30));
    offer(&mut w, "m", &cached, held("c", 0), t0 + Duration::from_millis(40));
    let (first, _) = w.take(t0 + Duration::from_secs(1)).unwrap();
    assert_eq!(first, id("m"), "the new holder goes first");
}

#[test]
fn a_fencing_epoch_that_rose_is_written_without_the_interval() {
    let (mut w, t0) = (Writes::default(), Instant::now());
    let cached = held("a", 0);
    offer(&mut w, "l", &cached, held("a", 1), t0);
    let (_, p) = w.take(t0).unwrap();
    let took = Duration::from_millis(100);
    written(&mut w, "l", &p.status, took, t0 + took);
    // A waiter count waits for the interval; the epoch another cluster published does not.
    offer(&mut w, "l", &cached, held("a", 2), t0 + took);
    assert_eq!(w.take(t0 + took), Err(Some(t0 + interval(took))));
    let risen = DistributedLockStatus {
        fencing_epoch: Some(1),
        ..held("a", 2)
    };
    offer(&mut w, "l", &cached, risen, t0 + took);
    let (_, p) = w.take(t0 + took).unwrap();
    assert_eq!(p.status.fencing_epoch, Some(1));
}
