//! A step sent through etcd-client, the client podlock's engine uses, and its answer written
//! down with only what must differ between two etcds taken out.

use super::requests::{Cmp, Range, Step, Txn};
use etcd_client::proto::PbResponseHeader;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions,
    PutOptions, SortOrder, SortTarget, TxnOp,
};

/// An answer: its protobuf message, normalised, as text, and a lease's TTL left apart.
#[derive(Debug)]
pub struct Answer {
    pub text: String,
    /// Read from each etcd's own clock, a second apart at worst: compared within one.
    pub ttl_left: Option<i64>,
}

impl From<String> for Answer {
    fn from(text: String) -> Self {
        Answer { text, ttl_left: None }
    }
}

/// An answer, or an error (code and message).
pub type Outcome = Result<Answer, String>;

/// Whether two outcomes agree.
pub fn same(a: &Outcome, b: &Outcome) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            let ttl = match (a.ttl_left, b.ttl_left) {
                (Some(x), Some(y)) => (x - y).abs() <= 1,
                (x, y) => x == y,
            };
            a.text == b.text && ttl
        }
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

/// Zeroes what two etcds cannot share: cluster and member ids, raft term.
pub fn normalise(h: &mut Option<PbResponseHeader>) {
    if let Some(h) = h {
        h.cluster_id = 0;
        h.member_id = 0;
        h.raft_term = 0;
    }
}

fn error(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        e => format!("not a gRPC status: {e}"),
    }
}

macro_rules! answer {
    ($call:expr) => {
        match $call.await {
            Ok(mut a) => {
                normalise(&mut a.0.header);
                Ok(Answer::from(format!("{:?}", a.0)))
            }
            Err(e) => Err(error(e)),
        }
    };
}

fn get_options(range: &Range, step: &Step) -> GetOptions {
    let Step::Get {
        revision,
        limit,
        sort,
        keys_only,
        count_only,
        filters,
        ..
    } = step
    else {
        unreachable!("a get")
    };
    let mut o = GetOptions::new().with_revision(*revision).with_limit(*limit);
    if !range.end.is_empty() {
        o = o.with_range(range.end.clone());
    }
    if let Some((target, order)) = sort {
        let target = SortTarget::try_from(*target).expect("a sort target");
        o = o.with_sort(target, SortOrder::try_from(*order).expect("a sort order"));
    }
    if *keys_only {
        o = o.with_keys_only();
    }
    if *count_only {
        o = o.with_count_only();
    }
    (o.with_min_mod_revision(filters[0])
        .with_max_mod_revision(filters[1]))
    .with_min_create_revision(filters[2])
    .with_max_create_revision(filters[3])
}

fn put_options(lease: i64, prev_kv: bool, ignore_value: bool, ignore_lease: bool) -> PutOptions {
    let mut o = PutOptions::new().with_lease(lease);
    if prev_kv {
        o = o.with_prev_key();
    }
    if ignore_value {
        o = o.with_ignore_value();
    }
    if ignore_lease {
        o = o.with_ignore_lease();
    }
    o
}

fn delete_options(range: &Range, prev_kv: bool) -> DeleteOptions {
    let mut o = DeleteOptions::new();
    if !range.end.is_empty() {
        o = o.with_range(range.end.clone());
    }
    if prev_kv { o.with_prev_key() } else { o }
}

fn compare(c: &Cmp) -> Compare {
    let op = CompareOp::try_from(c.result).expect("a compare result");
    let key = c.range.key.clone();
    let cmp = match c.target {
        0 => Compare::version(key, op, c.number),
        1 => Compare::create_revision(key, op, c.number),
        2 => Compare::mod_revision(key, op, c.number),
        3 => Compare::value(key, op, c.value.clone()),
        _ => Compare::lease(key, op, c.number),
    };
    if c.range.end.is_empty() {
        cmp
    } else {
        cmp.with_range(c.range.end.clone())
    }
}

fn op(step: &Step) -> TxnOp {
    match step {
        Step::Put {
            key,
            value,
            lease,
            prev_kv,
            ignore_value,
            ignore_lease,
        } => TxnOp::put(
            key.clone(),
            value.clone(),
            Some(put_options(*lease, *prev_kv, *ignore_value, *ignore_lease)),
        ),
        Step::Get { range, .. } => TxnOp::get(range.key.clone(), Some(get_options(range, step))),
        Step::Delete { range, prev_kv } => {
            TxnOp::delete(range.key.clone(), Some(delete_options(range, *prev_kv)))
        }
        Step::Txn(t) => TxnOp::txn(txn(t)),
        other => unreachable!("not a transaction's operation: {other:?}"),
    }
}

fn txn(t: &Txn) -> etcd_client::Txn {
    etcd_client::Txn::new()
        .when(t.compares.iter().map(compare).collect::<Vec<_>>())
        .and_then(t.success.iter().map(op).collect::<Vec<_>>())
        .or_else(t.failure.iter().map(op).collect::<Vec<_>>())
}

/// Sends `step` (not a watch step) and writes its answer down.
pub async fn send(c: &mut Client, step: &Step) -> Outcome {
    match step {
        Step::Put {
            key,
            value,
            lease,
            prev_kv,
            ignore_value,
            ignore_lease,
        } => {
            let o = put_options(*lease, *prev_kv, *ignore_value, *ignore_lease);
            answer!(c.put(key.clone(), value.clone(), Some(o)))
        }
        Step::Get { range, .. } => answer!(c.get(range.key.clone(), Some(get_options(range, step)))),
        Step::Delete { range, prev_kv } => {
            answer!(c.delete(range.key.clone(), Some(delete_options(range, *prev_kv))))
        }
        Step::Txn(t) => answer!(c.txn(txn(t))),
        Step::Grant { id, ttl } => answer!(c.lease_grant(*ttl, Some(LeaseGrantOptions::new().with_id(*id)))),
        Step::Revoke { id } => answer!(c.lease_revoke(*id)),
        Step::KeepAlive { id } => keep_alive(c, *id).await,
        Step::TimeToLive { id, keys } => time_to_live(c, *id, *keys).await,
        Step::Leases => leases(c).await,
        Step::Compact { revision } => answer!(c.compact(*revision, None)),
        Step::Expire { id, keys } => expiring(c, *id, keys).await,
        Step::Watch { .. } | Step::Cancel { .. } => unreachable!("watch steps go to the streams"),
    }
}

/// etcd-client reads the first keepalive answer itself (an error for a lease that is gone):
/// a second keepalive's answer is the one compared.
async fn keep_alive(c: &mut Client, id: i64) -> Outcome {
    let (mut keeper, mut answers) = c.lease_keep_alive(id).await.map_err(error)?;
    keeper.keep_alive().await.map_err(error)?;
    match answers.message().await {
        Ok(Some(mut a)) => {
            normalise(&mut a.0.header);
            Ok(Answer::from(format!("{:?}", a.0)))
        }
        Ok(None) => Err("the keepalive stream ended".to_string()),
        Err(e) => Err(error(e)),
    }
}

/// etcd lists a lease's keys from a Go map, in no order: sorted here. Its TTL left (-1: no
/// such lease, compared exactly) is set apart.
async fn time_to_live(c: &mut Client, id: i64, keys: bool) -> Outcome {
    let o = if keys {
        LeaseTimeToLiveOptions::new().with_keys()
    } else {
        LeaseTimeToLiveOptions::new()
    };
    let mut a = c.lease_time_to_live(id, Some(o)).await.map_err(error)?;
    normalise(&mut a.0.header);
    a.0.keys.sort();
    let ttl_left = (a.0.ttl >= 0).then(|| std::mem::take(&mut a.0.ttl));
    Ok(Answer {
        text: format!("{:?}", a.0),
        ttl_left,
    })
}

/// etcd lists leases by expiry: sorted by id here.
async fn leases(c: &mut Client) -> Outcome {
    let mut a = c.leases().await.map_err(error)?;
    normalise(&mut a.0.header);
    a.0.leases.sort_by_key(|l| l.id);
    Ok(Answer::from(format!("{:?}", a.0)))
}

/// Grants a lease below the smallest TTL and puts `keys` on it: each answer, in one outcome.
async fn expiring(c: &mut Client, id: i64, keys: &[String]) -> Outcome {
    let mut all = vec![answer!(
        c.lease_grant(1, Some(LeaseGrantOptions::new().with_id(id)))
    )];
    for k in keys {
        all.push(answer!(c.put(
            k.clone(),
            "expiring",
            Some(PutOptions::new().with_lease(id))
        )));
    }
    Ok(Answer::from(format!("{all:?}")))
}
