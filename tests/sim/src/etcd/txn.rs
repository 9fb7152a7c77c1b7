//! Transactions, nested ones included, in etcd's order: the request checked
//! (`checkTxnRequest`, `checkIntervals`), every compare of every taken branch judged on the store
//! as it was before the transaction (`compareToPath`), the taken puts and ranges checked, then
//! the operations applied as one revision.

use super::errors::EtcdError;
use super::kv;
use super::state::State;
use super::store::{KeyRange, Write};
use etcd_client::CompareOp;
use etcd_client::proto::{
    PbCompare, PbCompareTarget, PbResponseOp, PbTargetUnion, PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest,
    PbTxnRequestOp, PbTxnResponse,
};
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// etcd's `checkTxnRequest`: sizes and keys, nested transactions within what is left of
/// `max_ops`.
fn validate(r: &PbTxnRequest, max_ops: usize) -> Result<(), EtcdError> {
    let ops = r.compare.len().max(r.success.len()).max(r.failure.len());
    if ops > max_ops {
        return Err(EtcdError::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(EtcdError::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            Some(PbTxnOpRequest::RequestRange(r)) => kv::validate_range(r)?,
            Some(PbTxnOpRequest::RequestPut(r)) => kv::validate_put(r)?,
            Some(PbTxnOpRequest::RequestDeleteRange(r)) => kv::validate_delete(r)?,
            Some(PbTxnOpRequest::RequestTxn(t)) => validate(t, max_ops - ops)?,
            None => {}
        }
    }
    Ok(())
}

/// A delete's interval as etcd's `checkIntervals` builds it: literal string bounds, a point
/// being `[key, key\0)`; `end` `\0` is no `mkGteRange` here, so such a delete overlaps no put.
struct Interval(Vec<u8>, Vec<u8>);

impl Interval {
    fn holds(&self, key: &[u8]) -> bool {
        self.0.as_slice() <= key && key < self.1.as_slice()
    }
}

/// etcd's `checkIntervals` on one branch: no key put twice, no key both put and deleted, where
/// the two branches of a nested transaction may put the same key (only one runs). Returns the
/// branch's puts and deletes.
fn check_intervals(ops: &[PbTxnRequestOp]) -> Result<(BTreeSet<Vec<u8>>, Vec<Interval>), EtcdError> {
    let mut dels: Vec<Interval> = (ops.iter())
        .filter_map(|op| match &op.request {
            Some(PbTxnOpRequest::RequestDeleteRange(d)) if d.range_end.is_empty() => {
                Some(Interval(d.key.clone(), [d.key.as_slice(), &[0]].concat()))
            }
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => Some(Interval(d.key.clone(), d.range_end.clone())),
            _ => None,
        })
        .collect();
    let mut puts: BTreeSet<Vec<u8>> = BTreeSet::new();
    let clash = |puts: &BTreeSet<Vec<u8>>, dels: &[Interval], k: &[u8]| {
        puts.contains(k) || dels.iter().any(|d| d.holds(k))
    };
    for op in ops {
        let Some(PbTxnOpRequest::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (then_puts, then_dels) = check_intervals(&t.success)?;
        let (else_puts, else_dels) = check_intervals(&t.failure)?;
        for k in &then_puts {
            if clash(&puts, &dels, k) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in &else_puts {
            let twice = puts.contains(k) && !then_puts.contains(k);
            if twice || dels.iter().any(|d| d.holds(k)) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        dels.extend(then_dels.into_iter().chain(else_dels));
    }
    for op in ops {
        let Some(PbTxnOpRequest::RequestPut(p)) = &op.request else {
            continue;
        };
        if clash(&puts, &dels, &p.key) {
            return Err(EtcdError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// Which branch a transaction takes, and the same for each nested transaction on it, in order.
struct Path {
    taken: bool,
    nested: Vec<Path>,
}

impl Path {
    /// etcd's `compareToPath`: every compare, nested ones too, judged before any write.
    fn of(state: &State, r: &PbTxnRequest) -> Path {
        let taken = r.compare.iter().all(|c| compare(state, c));
        let nested = (branch(r, taken).iter())
            .filter_map(|op| match &op.request {
                Some(PbTxnOpRequest::RequestTxn(t)) => Some(Path::of(state, t)),
                _ => None,
            })
            .collect();
        Path { taken, nested }
    }
}

fn branch(r: &PbTxnRequest, taken: bool) -> &[PbTxnRequestOp] {
    if taken { &r.success } else { &r.failure }
}

/// etcd's `applyCompare`: every key in the range must pass; a range with no key compares a
/// zero key-value, except a value compare, which then fails.
fn compare(state: &State, c: &PbCompare) -> bool {
    let kvs = state.store.range_at(&KeyRange::new(&c.key, &c.range_end), 0);
    let target = PbCompareTarget::try_from(c.target).unwrap_or(PbCompareTarget::Version);
    if kvs.is_empty() {
        return target != PbCompareTarget::Value && compare_kv(c, target, &Default::default());
    }
    kvs.iter().all(|kv| compare_kv(c, target, kv))
}

fn compare_kv(c: &PbCompare, target: PbCompareTarget, kv: &etcd_client::proto::PbKeyValue) -> bool {
    // A target union of another kind than the target compares with zero, as etcd's does.
    let number = |got: i64| -> Ordering {
        let want = match (&c.target_union, target) {
            (Some(PbTargetUnion::Version(v)), PbCompareTarget::Version)
            | (Some(PbTargetUnion::CreateRevision(v)), PbCompareTarget::Create)
            | (Some(PbTargetUnion::ModRevision(v)), PbCompareTarget::Mod)
            | (Some(PbTargetUnion::Lease(v)), PbCompareTarget::Lease) => *v,
            _ => 0,
        };
        got.cmp(&want)
    };
    let result = match target {
        PbCompareTarget::Value => match &c.target_union {
            Some(PbTargetUnion::Value(v)) => kv.value.as_slice().cmp(v.as_slice()),
            _ => kv.value.as_slice().cmp(&[]),
        },
        PbCompareTarget::Create => number(kv.create_revision),
        PbCompareTarget::Mod => number(kv.mod_revision),
        PbCompareTarget::Version => number(kv.version),
        PbCompareTarget::Lease => number(kv.lease),
    };
    match CompareOp::try_from(c.result) {
        Ok(CompareOp::Equal) => result.is_eq(),
        Ok(CompareOp::NotEqual) => result.is_ne(),
        Ok(CompareOp::Greater) => result.is_gt(),
        Ok(CompareOp::Less) => result.is_lt(),
        Err(_) => true,
    }
}

/// etcd 3.6's `checkTxn` on the taken branches: each put and range in order, the first refusal
/// answered (etcd 3.5 checked every put before any range).
fn check(state: &State, r: &PbTxnRequest, path: &Path) -> Result<(), EtcdError> {
    walk_taken(r, path, &mut |op| match op {
        PbTxnOpRequest::RequestPut(p) => kv::check_txn_put(state, p),
        // etcd's checkRange: unlike a range on its own, a negative revision is "compacted"
        // once any compaction ran (it is below the compacted revision, at least 0).
        PbTxnOpRequest::RequestRange(q) if q.revision < 0 && q.revision < state.store.compacted() => {
            Err(EtcdError::Compacted)
        }
        PbTxnOpRequest::RequestRange(q) => state.store.check_readable(q.revision),
        _ => Ok(()),
    })
}

fn walk_taken(
    r: &PbTxnRequest,
    path: &Path,
    f: &mut impl FnMut(&PbTxnOpRequest) -> Result<(), EtcdError>,
) -> Result<(), EtcdError> {
    let mut nested = path.nested.iter();
    for op in branch(r, path.taken).iter().filter_map(|op| op.request.as_ref()) {
        match op {
            PbTxnOpRequest::RequestTxn(t) => walk_taken(t, nested.next().expect("a path per txn"), f)?,
            op => f(op)?,
        }
    }
    Ok(())
}

/// The key of the first put among `r`'s success operations, then its failure ones, nested
/// transactions' included (a test holds a transaction back by it:
/// [`super::Etcd::hold_next_txn`]).
pub fn first_put(r: &PbTxnRequest) -> Option<&[u8]> {
    (r.success.iter().chain(&r.failure)).find_map(|op| match &op.request {
        Some(PbTxnOpRequest::RequestPut(p)) => Some(p.key.as_slice()),
        Some(PbTxnOpRequest::RequestTxn(t)) => first_put(t),
        _ => None,
    })
}

/// Runs transaction `r`: one revision for all its writes; its answer's header carries it.
pub fn run(state: &mut State, r: &PbTxnRequest) -> Result<PbTxnResponse, EtcdError> {
    validate(r, state.config.max_txn_ops)?;
    check_intervals(&r.success)?;
    check_intervals(&r.failure)?;
    let path = Path::of(state, r);
    check(state, r, &path)?;
    let mut write = state.store.begin();
    let mut answer = apply(state, &mut write, r, &path)?;
    answer.header = kv::header(write.read_revision());
    state.commit(write);
    Ok(answer)
}

fn apply(
    state: &State,
    write: &mut Write,
    r: &PbTxnRequest,
    path: &Path,
) -> Result<PbTxnResponse, EtcdError> {
    let mut nested = path.nested.iter();
    let mut one = |op: &PbTxnOpRequest| -> Result<PbTxnOpResponse, EtcdError> {
        Ok(match op {
            PbTxnOpRequest::RequestRange(q) => PbTxnOpResponse::ResponseRange(
                kv::range(state, Some(write), q).expect("a range checked before the transaction"),
            ),
            PbTxnOpRequest::RequestPut(p) => PbTxnOpResponse::ResponsePut(kv::put(state, write, p)?),
            PbTxnOpRequest::RequestDeleteRange(d) => {
                PbTxnOpResponse::ResponseDeleteRange(kv::delete(state, write, d))
            }
            PbTxnOpRequest::RequestTxn(t) => {
                let p = nested.next().expect("a path per txn");
                PbTxnOpResponse::ResponseTxn(apply(state, write, t, p)?)
            }
        })
    };
    let mut responses = Vec::new();
    for op in branch(r, path.taken) {
        let response = op.request.as_ref().map(&mut one).transpose()?;
        responses.push(PbResponseOp { response });
    }
    // A nested transaction's header stays empty: etcd sets only the outermost one's revision.
    Ok(PbTxnResponse {
        header: Some(Default::default()),
        succeeded: path.taken,
        responses,
    })
}
