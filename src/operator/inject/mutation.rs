//! The webhook's answer for one object ([`Mutation`]), and how the admitted object's JSON is
//! read and built: an annotation by its name, an object along a path.

use serde_json::{Map, Value};

/// The webhook's answer for one object: a patch, a warning for the user, both or neither.
#[derive(Debug, Default)]
pub struct Mutation {
    /// The change to make, if any.
    pub patch: Option<json_patch::Patch>,
    /// Why an object that asked for the sidecar did not get it.
    pub warning: Option<String>,
}

/// The annotation `name` in the metadata at `meta`.
pub(super) fn annotation<'a>(object: &'a Value, meta: &str, name: &str) -> Option<&'a str> {
    object
        .pointer(&format!("{meta}/annotations/{}", escape(name)))
        .and_then(Value::as_str)
}

/// The object at `path`, created (with its parents) when missing.
pub(super) fn ensure_object<'a>(root: &'a mut Value, path: &str) -> &'a mut Map<String, Value> {
    let mut node = root;
    for part in path.split('/').skip(1) {
        node = node
            .as_object_mut()
            .expect("objects along the path")
            .entry(part)
            .or_insert(Value::Object(Map::new()));
    }
    node.as_object_mut().expect("an object")
}

/// Escapes a key for a JSON pointer.
pub(super) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
