use super::*;

/// The record of a Secret with `ca` and owned by `owner` (a uid).
fn written(ca: Option<&[u8]>, owner: Option<&str>) -> Record {
    let owner = owner.map(|uid| OwnerReference {
        uid: uid.into(),
        ..OwnerReference::default()
    });
    let credentials = Credentials {
        namespace: "app",
        user: "podlock-ns-app".into(),
        password: "secret",
        ca,
        owner: owner.as_ref(),
        cluster: "",
    };
    credentials.record()
}

/// `record` as etcd stores it.
fn stored(record: &Record) -> String {
    serde_json::to_string(record).unwrap()
}

#[test]
fn a_secret_etcd_vouches_for_stays() {
    let now = written(Some(b"CA 1"), Some("uid-1"));
    assert_eq!(rewrite(false, Some(&stored(&now)), &now), None);
    let plain = written(None, None);
    assert_eq!(rewrite(false, Some(&stored(&plain)), &plain), None);
}

#[test]
fn a_new_etcd_password_outdates_whatever_is_recorded() {
    // A fresh etcd (new volumes) has neither password nor record; the password is new even
    // if a record of the same CA and owner survived.
    let now = written(Some(b"CA 1"), Some("uid-1"));
    assert_eq!(rewrite(true, None, &now), Some(Rewrite::NewPassword));
    assert_eq!(
        rewrite(true, Some(&stored(&now)), &now),
        Some(Rewrite::NewPassword)
    );
}

#[test]
fn a_secret_without_a_record_is_written_again() {
    // An older operator's (its password only was recorded), or a record that is not one.
    let now = written(Some(b"CA 1"), Some("uid-1"));
    assert_eq!(rewrite(false, None, &now), Some(Rewrite::Unrecorded));
    assert_eq!(rewrite(false, Some("not json"), &now), Some(Rewrite::Unrecorded));
}

#[test]
fn another_ca_or_owner_makes_it_stale() {
    let before = written(Some(b"CA 1"), Some("uid-1"));
    let new_ca = written(Some(b"CA 2"), Some("uid-1"));
    assert_eq!(
        rewrite(false, Some(&stored(&before)), &new_ca),
        Some(Rewrite::CaChanged)
    );
    let tls_off = written(None, Some("uid-1"));
    assert_eq!(
        rewrite(false, Some(&stored(&before)), &tls_off),
        Some(Rewrite::CaChanged)
    );
    let new_owner = written(Some(b"CA 1"), Some("uid-2"));
    assert_eq!(
        rewrite(false, Some(&stored(&before)), &new_owner),
        Some(Rewrite::OwnerChanged)
    );
    let unowned = written(Some(b"CA 1"), None);
    assert_eq!(
        rewrite(false, Some(&stored(&unowned)), &before),
        Some(Rewrite::OwnerChanged)
    );
}

#[test]
fn the_secret_is_owned_and_labelled() {
    let owner = OwnerReference {
        kind: "ClusterRole".into(),
        name: "podlock-operator".into(),
        uid: "uid-1".into(),
        ..OwnerReference::default()
    };
    let credentials = Credentials {
        namespace: "app",
        user: "podlock-ns-app".into(),
        password: "secret",
        ca: Some(b"CA"),
        owner: Some(&owner),
        cluster: "",
    };
    let secret = credentials.object();
    assert_eq!(secret.metadata.owner_references, Some(vec![owner]));
    let labels = secret.metadata.labels.unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "podlock-operator");
    let data = secret.data.unwrap();
    assert_eq!(data["password"].0, b"secret");
    assert_eq!(data["ca.crt"].0, b"CA");
}
