//! Unit tests of `multi`: the checks of a set.

use super::*;

fn request(lock: &str, with: &[&str]) -> AcquireRequest {
    let id = |name: &str| LockId::new("ns", name).unwrap();
    AcquireRequest {
        lock: id(lock),
        holder_id: "h".into(),
        wait: Duration::ZERO,
        ttl_seconds: None,
        heartbeat_timeout_seconds: None,
        max_hold_seconds: None,
        deadline_warning_seconds: None,
        container: None,
        permits: 1,
        mode: Default::default(),
        connection_bound: false,
        with: with.iter().map(|n| id(n)).collect(),
    }
}

#[test]
fn a_set_is_distinct_locks_of_one_namespace_at_most_eight() {
    let names = |r: &AcquireRequest| {
        check_set(r)
            .unwrap()
            .iter()
            .map(|l| l.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&request("a", &["c", "b"])),
        ["a", "c", "b"],
        "the request's order"
    );
    assert!(check_set(&request("a", &["b", "a"])).is_err());
    assert!(check_set(&request("a", &["b", "b"])).is_err());
    assert!(check_set(&request("a", &["1", "2", "3", "4", "5", "6", "7"])).is_ok());
    assert!(check_set(&request("a", &["1", "2", "3", "4", "5", "6", "7", "8"])).is_err());
    let mut other = request("a", &["b"]);
    other.with[0].namespace = "elsewhere".into();
    assert!(check_set(&other).is_err());
}
