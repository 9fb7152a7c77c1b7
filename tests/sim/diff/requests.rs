//! Seeded random requests: a small key space so that keys collide, leases from a small pool so
//! that grants clash and puts name missing leases, revisions around the compacted and current
//! ones so that reads and watches hit both edges.

pub use podlock_sim::rng::Rng;

/// Where the workload's keys live; the watch streams' anchors are outside it.
pub const PREFIX: &str = "/d/";
const KEYS: u64 = 8;
/// Lease ids the workload grants, revokes and names.
pub const LEASES: [i64; 5] = [7001, 7002, 7003, 7004, 7005];

/// A key range: `end` as sent (empty: the key alone; `\0`: from the key on).
#[derive(Clone, Debug)]
pub struct Range {
    pub key: String,
    pub end: String,
}

/// One request (or a pause for lease expiry) sent to both etcds.
#[derive(Clone, Debug)]
pub enum Step {
    Put {
        key: String,
        value: String,
        lease: i64,
        prev_kv: bool,
        ignore_value: bool,
        ignore_lease: bool,
    },
    Get {
        range: Range,
        revision: i64,
        limit: i64,
        sort: Option<(i32, i32)>,
        keys_only: bool,
        count_only: bool,
        filters: [i64; 4],
    },
    Delete {
        range: Range,
        prev_kv: bool,
    },
    Txn(Txn),
    Grant {
        id: i64,
        ttl: i64,
    },
    Revoke {
        id: i64,
    },
    KeepAlive {
        id: i64,
    },
    TimeToLive {
        id: i64,
        keys: bool,
    },
    Leases,
    Compact {
        revision: i64,
    },
    Watch {
        stream: usize,
        range: Range,
        start: i64,
        prev_kv: bool,
        filters: Vec<i32>,
        id: i64,
    },
    Cancel {
        stream: usize,
        id: i64,
    },
    /// Grants lease `id` for less than the smallest TTL, puts `keys` on it, then waits until
    /// it has expired on both.
    Expire {
        id: i64,
        keys: Vec<String>,
    },
}

/// A compare: target (etcd's CompareTarget), result (CompareResult), key range, operand.
#[derive(Clone, Debug)]
pub struct Cmp {
    pub target: i32,
    pub result: i32,
    pub range: Range,
    pub number: i64,
    pub value: String,
}

#[derive(Clone, Debug)]
pub struct Txn {
    pub compares: Vec<Cmp>,
    pub success: Vec<Step>,
    pub failure: Vec<Step>,
}

/// What the generator knows of the etcd it talks to (read from the simulated one's answers).
#[derive(Default)]
pub struct Known {
    pub revision: i64,
    pub compacted: i64,
    pub streams: usize,
}

pub fn key(rng: &mut Rng) -> String {
    format!("{PREFIX}k{}", rng.below(KEYS))
}

fn range(rng: &mut Rng) -> Range {
    let k = key(rng);
    let end = match rng.below(6) {
        0 | 1 => String::new(),
        2 => "/d0".to_string(), // the whole prefix
        3 => "\0".to_string(),
        4 => key(rng),         // before, at or after the key: empty ranges too
        _ => format!("{k}\0"), // [k, k\0): the key alone, as a range
    };
    let key = if rng.one_in(40) { String::new() } else { k };
    Range { key, end }
}

/// A revision near the edges: 0, compacted ± 1, current ± 1, in between.
fn revision(rng: &mut Rng, k: &Known) -> i64 {
    let r = k.revision;
    let c = k.compacted;
    *rng.pick(&[0, 0, 0, c - 1, c, c + 1, r - 1, r, r + 1, (c + r) / 2, -1])
        .max(&-1)
}

fn lease(rng: &mut Rng) -> i64 {
    if rng.one_in(2) { 0 } else { *rng.pick(&LEASES) }
}

fn put(rng: &mut Rng) -> Step {
    let ignore_value = rng.one_in(8);
    let value = match (ignore_value, rng.one_in(6)) {
        (true, false) | (false, true) => String::new(),
        _ => format!("v{}", rng.below(5)),
    };
    let ignore_lease = rng.one_in(8);
    Step::Put {
        key: key(rng),
        value,
        lease: if ignore_lease && !rng.one_in(4) {
            0
        } else {
            lease(rng)
        },
        prev_kv: rng.one_in(2),
        ignore_value,
        ignore_lease,
    }
}

fn get(rng: &mut Rng, k: &Known) -> Step {
    let filter = |rng: &mut Rng| if rng.one_in(4) { revision(rng, k).max(0) } else { 0 };
    Step::Get {
        range: range(rng),
        revision: revision(rng, k),
        limit: *rng.pick(&[0, 0, 1, 2, 3]),
        sort: (!rng.one_in(2)).then(|| (rng.below(5) as i32, rng.below(3) as i32)),
        keys_only: rng.one_in(4),
        count_only: rng.one_in(6),
        filters: [filter(rng), filter(rng), filter(rng), filter(rng)],
    }
}

fn delete(rng: &mut Rng) -> Step {
    Step::Delete {
        range: range(rng),
        prev_kv: rng.one_in(2),
    }
}

/// A transaction's delete never runs from a key on (range end `\0`): etcd 3.5.17's
/// `checkIntervals` then misses a later put of a deleted key, and such a put with
/// `ignore_lease` or `ignore_value` panics every member that applies it (a crash loop: the
/// entry is replayed at each start).
fn txn_delete(rng: &mut Rng) -> Step {
    let mut step = delete(rng);
    if let Step::Delete { range, .. } = &mut step
        && range.end == "\0"
    {
        range.end = "/d0".to_string();
    }
    step
}

fn compare(rng: &mut Rng, k: &Known) -> Cmp {
    let target = rng.below(5) as i32;
    Cmp {
        target,
        result: rng.below(4) as i32,
        range: if rng.one_in(4) {
            range(rng)
        } else {
            Range {
                key: key(rng),
                end: String::new(),
            }
        },
        number: match target {
            0 => rng.below(4) as i64,
            4 => lease(rng),
            _ => revision(rng, k).max(0),
        },
        value: format!("v{}", rng.below(5)),
    }
}

/// A transaction; `depth` bounds its nesting.
pub fn txn(rng: &mut Rng, k: &Known, depth: u32) -> Txn {
    let ops = |rng: &mut Rng| {
        (0..rng.below(4))
            .map(|_| match rng.below(if depth > 0 { 5 } else { 4 }) {
                0 => put(rng),
                1 => get(rng, k),
                2 => txn_delete(rng),
                3 => put(rng),
                _ => Step::Txn(txn(rng, k, depth - 1)),
            })
            .collect()
    };
    Txn {
        compares: (0..rng.below(3)).map(|_| compare(rng, k)).collect(),
        success: ops(rng),
        failure: ops(rng),
    }
}

fn watch(rng: &mut Rng, k: &Known) -> Step {
    let filters = match rng.below(6) {
        0 => vec![0],
        1 => vec![1],
        _ => Vec::new(),
    };
    Step::Watch {
        stream: rng.below(k.streams as u64) as usize,
        range: range(rng),
        start: revision(rng, k).max(0),
        prev_kv: rng.one_in(2),
        filters,
        // Mostly ids the server picks; some chosen, some of them taken already.
        id: if rng.one_in(4) { 1 + rng.below(4) as i64 } else { 0 },
    }
}

/// The next step.
pub fn step(rng: &mut Rng, k: &Known) -> Step {
    let id = *rng.pick(&LEASES);
    match rng.below(100) {
        0..=24 => put(rng),
        25..=39 => get(rng, k),
        40..=46 => delete(rng),
        47..=61 => Step::Txn(txn(rng, k, 2)),
        // No short TTL here: a lease expiring between two steps would do so at a different
        // step on each side; Step::Expire covers expiry and the smallest TTL.
        62..=66 => Step::Grant {
            id,
            ttl: *rng.pick(&[60, 120, 9_000_000_000, 9_000_000_001]),
        },
        67..=69 => Step::Revoke { id },
        70..=72 => Step::KeepAlive { id },
        73..=75 => Step::TimeToLive {
            id,
            keys: rng.one_in(2),
        },
        76 => Step::Leases,
        77..=79 => Step::Compact {
            revision: revision(rng, k),
        },
        80..=90 => watch(rng, k),
        // Never watch 0, each stream's anchor.
        91..=96 => Step::Cancel {
            stream: rng.below(k.streams as u64) as usize,
            id: 1 + rng.below(5) as i64,
        },
        _ if rng.one_in(5) => Step::Expire {
            id: 7100 + rng.below(1000) as i64,
            keys: (0..rng.below(3)).map(|_| key(rng)).collect(),
        },
        _ => put(rng),
    }
}
