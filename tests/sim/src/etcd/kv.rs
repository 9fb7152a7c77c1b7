//! Range, put and delete, as etcd's applier runs them on their own or within a transaction:
//! the checks made before anything is written, then the operation on a [`Write`].

use super::errors::EtcdError;
use super::state::State;
use super::store::{KeyRange, Write};
use etcd_client::proto::{
    PbDeleteRequest, PbDeleteResponse, PbKeyValue, PbPutRequest, PbPutResponse, PbRangeRequest,
    PbRangeResponse, PbResponseHeader,
};
use etcd_client::{SortOrder, SortTarget};
use std::cmp::Ordering;

/// A header with only a revision: what etcd's applier puts in each answer; the server fills in
/// the rest of a top-level answer's ([`State::fill`]).
pub fn header(revision: i64) -> Option<PbResponseHeader> {
    Some(PbResponseHeader {
        revision,
        ..PbResponseHeader::default()
    })
}

/// etcd's `checkRangeRequest`.
pub fn validate_range(r: &PbRangeRequest) -> Result<(), EtcdError> {
    non_empty(&r.key)
}

/// etcd's `checkPutRequest`.
pub fn validate_put(r: &PbPutRequest) -> Result<(), EtcdError> {
    non_empty(&r.key)?;
    if r.ignore_value && !r.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkDeleteRequest`.
pub fn validate_delete(r: &PbDeleteRequest) -> Result<(), EtcdError> {
    non_empty(&r.key)
}

fn non_empty(key: &[u8]) -> Result<(), EtcdError> {
    if key.is_empty() {
        Err(EtcdError::EmptyKey)
    } else {
        Ok(())
    }
}

/// What etcd checks of a put on its own before it writes: its lease exists, then the key
/// exists if its value or lease is kept.
pub fn check_put(state: &State, r: &PbPutRequest) -> Result<(), EtcdError> {
    lease_exists(state, r)?;
    kept_key_exists(state, r)
}

/// The same checks within a transaction (etcd's `checkRequestPut`), in the other order.
pub fn check_txn_put(state: &State, r: &PbPutRequest) -> Result<(), EtcdError> {
    kept_key_exists(state, r)?;
    lease_exists(state, r)
}

fn lease_exists(state: &State, r: &PbPutRequest) -> Result<(), EtcdError> {
    if r.lease != 0 && state.leases.get(r.lease).is_none() {
        return Err(EtcdError::LeaseNotFound);
    }
    Ok(())
}

fn kept_key_exists(state: &State, r: &PbPutRequest) -> Result<(), EtcdError> {
    let exists = || state.store.get_at(&r.key, state.store.revision()).is_some();
    if (r.ignore_value || r.ignore_lease) && !exists() {
        return Err(EtcdError::KeyNotFound);
    }
    Ok(())
}

/// A range read as `write` sees the store (`None`: a read on its own).
pub fn range(state: &State, write: Option<&Write>, r: &PbRangeRequest) -> Result<PbRangeResponse, EtcdError> {
    let current = write.map_or(state.store.revision(), Write::read_revision);
    if r.revision > current {
        return Err(EtcdError::FutureRevision);
    }
    let at = if r.revision <= 0 { current } else { r.revision };
    if at < state.store.compacted() {
        return Err(EtcdError::Compacted);
    }
    let range = KeyRange::new(&r.key, &r.range_end);
    let mut kvs = match write {
        Some(w) if at == current => w.range(&state.store, &range),
        _ => state.store.range_at(&range, at),
    };
    // The count is of every key in the range, before the filters and the limit.
    let count = kvs.len() as i64;
    if r.count_only {
        kvs.clear();
    }
    kvs.retain(|kv| passes_filters(r, kv));
    sort(r, &mut kvs);
    let more = r.limit > 0 && kvs.len() as i64 > r.limit;
    if more {
        kvs.truncate(r.limit as usize);
    }
    if r.keys_only {
        kvs.iter_mut().for_each(|kv| kv.value.clear());
    }
    Ok(PbRangeResponse {
        header: header(current),
        kvs,
        more,
        count,
    })
}

fn passes_filters(r: &PbRangeRequest, kv: &PbKeyValue) -> bool {
    let at_most = |bound: i64, v: i64| bound == 0 || v <= bound;
    let at_least = |bound: i64, v: i64| bound == 0 || v >= bound;
    at_most(r.max_mod_revision, kv.mod_revision)
        && at_least(r.min_mod_revision, kv.mod_revision)
        && at_most(r.max_create_revision, kv.create_revision)
        && at_least(r.min_create_revision, kv.create_revision)
}

/// Sorts as etcd's Range does: keys come in key order, so a key-ascending sort is skipped and a
/// target other than the key without an order sorts ascending. Go's sort.Sort is an insertion
/// sort up to 12 elements, stable like this one; beyond that etcd's order among equal elements
/// is pdqsort's and this one keeps key order.
fn sort(r: &PbRangeRequest, kvs: &mut [PbKeyValue]) {
    let target = SortTarget::try_from(r.sort_target).unwrap_or(SortTarget::Key);
    let order = match SortOrder::try_from(r.sort_order).unwrap_or(SortOrder::None) {
        SortOrder::None if target != SortTarget::Key => SortOrder::Ascend,
        SortOrder::Ascend if target == SortTarget::Key => SortOrder::None,
        order => order,
    };
    let cmp = |a: &PbKeyValue, b: &PbKeyValue| -> Ordering {
        match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        }
    };
    match order {
        SortOrder::None => {}
        SortOrder::Ascend => kvs.sort_by(cmp),
        SortOrder::Descend => kvs.sort_by(|a, b| cmp(b, a)),
    }
}

/// A put on `write` (checked already). A put that keeps the value or lease of a key its own
/// transaction deleted passed every check but cannot be applied: etcd panics there.
pub fn put(state: &State, write: &mut Write, r: &PbPutRequest) -> Result<PbPutResponse, EtcdError> {
    let prev = write.range(&state.store, &KeyRange::new(&r.key, &[])).pop();
    if (r.ignore_value || r.ignore_lease) && prev.is_none() {
        return Err(EtcdError::WouldPanic);
    }
    let value = match (&prev, r.ignore_value) {
        (Some(p), true) => p.value.clone(),
        _ => r.value.clone(),
    };
    let lease = match (&prev, r.ignore_lease) {
        (Some(p), true) => p.lease,
        _ => r.lease,
    };
    let prev = write.put(&state.store, &r.key, value, lease);
    Ok(PbPutResponse {
        header: header(write.read_revision()),
        prev_kv: prev.filter(|_| r.prev_kv),
    })
}

/// A delete on `write`.
pub fn delete(state: &State, write: &mut Write, r: &PbDeleteRequest) -> PbDeleteResponse {
    let gone = write.delete(&state.store, &KeyRange::new(&r.key, &r.range_end));
    PbDeleteResponse {
        header: header(write.read_revision()),
        deleted: gone.len() as i64,
        prev_kvs: if r.prev_kv { gone } else { Vec::new() },
    }
}
