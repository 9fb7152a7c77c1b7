//! The release receipts' checker: a release's answer says what its own transaction did, which
//! the receipt it put in that transaction records (`src/lock/txn/receipt.rs`): a release of a
//! key whose receipt names it deleted that key itself, and must be answered `released`; one
//! answered `released` while its lease lives on and no receipt names its key did not, and
//! must have been answered `lost` (unless etcd was restored or wiped since it was asked,
//! which takes receipts back).

use super::NAMESPACE;
use super::check::QUEUE_PREFIX;
use crate::etcd::Etcd;
use podlock::lock::{Grant, Token};

/// Whether a receipt of `g`'s lock and lease names `g`'s key: a release of exactly that key
/// put it.
fn receipted(etcd: &Etcd, g: &Grant) -> bool {
    let prefix = format!(
        "{QUEUE_PREFIX}{NAMESPACE}/.released/{}/{:016x}/",
        g.lock.name, g.lease_id
    );
    let revision = Token::from_raw(g.fencing_token).revision().to_string();
    etcd.inspect(|s| (s.keys_under(prefix.as_bytes()).iter()).any(|kv| kv.value == revision.as_bytes()))
}

/// Checks the answer to `holder`'s release of `g` (`released`, or `lost`); `rebuilt`: etcd was
/// restored or wiped since the release was asked.
pub fn check(etcd: &Etcd, (holder, g): (&str, &Grant), released: bool, rebuilt: bool) -> Result<(), String> {
    let receipt = receipted(etcd, g);
    let token = g.fencing_token;
    if !released && receipt {
        return Err(format!(
            "receipt: {holder}'s release of token {token} answered lost, but its receipt says it released"
        ));
    }
    let lease = etcd.inspect(|s| s.leases.ids().any(|id| id == g.lease_id));
    if released && !receipt && lease && !rebuilt {
        return Err(format!(
            "receipt: {holder}'s release of token {token} answered released, but no receipt names its key"
        ));
    }
    Ok(())
}
