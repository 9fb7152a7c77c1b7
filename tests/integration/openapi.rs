//! `docs/openapi.yaml` tells the truth: every documented operation is exercised on a real
//! sidecar, every answer's status is documented for it, and every JSON body fits its schema.

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::{EtcdServer, Sidecar, declare};

const SPEC: &str = include_str!("../../docs/openapi.yaml");

/// Checks `value` against `schema` (the subset of OpenAPI schemas the file uses).
fn check(spec: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let target = spec
            .pointer(r.trim_start_matches('#'))
            .ok_or(format!("dangling {r}"))?;
        return check(spec, target, value, at);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        return match options.iter().any(|o| check(spec, o, value, at).is_ok()) {
            true => Ok(()),
            false => Err(format!("{at}: {value} fits none of {options:?}")),
        };
    }
    if value.is_null() && schema["nullable"] == true {
        return Ok(());
    }
    let ok = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    };
    if !ok {
        return Err(format!("{at}: {value} is not {}", schema["type"]));
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        return Err(format!("{at}: {value} not in {options:?}"));
    }
    for field in schema["required"].as_array().into_iter().flatten() {
        let field = field.as_str().unwrap();
        if value.get(field).is_none() {
            return Err(format!("{at}: required {field} missing in {value}"));
        }
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in value.as_object().into_iter().flatten() {
            match props.get(k) {
                Some(s) => check(spec, s, v, &format!("{at}.{k}"))?,
                None => return Err(format!("{at}: undocumented field {k}")),
            }
        }
    }
    if let Some(items) = schema.get("items") {
        for (i, v) in value.as_array().into_iter().flatten().enumerate() {
            check(spec, items, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// The documented schema of an answer (resolving a `$ref`d response), with its content type.
fn documented<'a>(
    spec: &'a Value,
    path: &str,
    method: &str,
    status: u16,
) -> Result<(&'a str, &'a Value), String> {
    let op = &spec["paths"][path][method];
    let mut resp = op["responses"]
        .get(status.to_string())
        .ok_or(format!("{method} {path}: {status} undocumented"))?;
    if let Some(r) = resp["$ref"].as_str() {
        resp = spec.pointer(r.trim_start_matches('#')).unwrap();
    }
    let (ctype, media) = resp["content"]
        .as_object()
        .and_then(|c| c.iter().next())
        .ok_or("no content")?;
    Ok((ctype.as_str(), &media["schema"]))
}

/// Checks that the first event of the stream `resp` fits the documented schema of `path`'s 200.
async fn first_event_fits(spec: &Value, mut resp: reqwest::Response, path: &str, method: &str) {
    let (ctype, schema) = documented(spec, path, method, 200).unwrap();
    let got = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(got.starts_with(ctype), "{method} {path}: content-type {got}");
    let chunk = tokio::time::timeout(Duration::from_secs(2), resp.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let frame = String::from_utf8(chunk.to_vec()).unwrap();
    let data: String = frame.lines().filter_map(|l| l.strip_prefix("data:")).collect();
    let value = serde_json::from_str(data.trim()).unwrap();
    check(spec, schema, &value, &format!("{method} {path} event")).unwrap();
}

#[tokio::test]
async fn the_server_answers_as_the_openapi_file_says() {
    let spec: Value = serde_yaml::from_str(SPEC).unwrap();
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["doc"]);
    declare(&etcd.endpoint, &["streamed"]);
    declare(&etcd.endpoint, &["pair"]);
    declare(&etcd.endpoint, &["pair-2"]);
    declare(&etcd.endpoint, &["beat", "--heartbeat-timeout-seconds", "1"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let events = reqwest::get(format!("{}/v1/locks/doc/events", s.addr))
        .await
        .unwrap();
    let watch = reqwest::get(format!("{}/v1/locks/doc/watch", s.addr))
        .await
        .unwrap();
    let big = Value::String(" ".repeat(1024 * 1024));
    // (method, documented path, concrete path, body)
    let calls: Vec<(&str, &str, String, Value)> = vec![
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/doc/acquire".into(),
            json!({}),
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/doc/acquire".into(),
            json!({"holderId": "b", "waitSeconds": 0}),
        ),
        (
            "post",
            "/v1/locks/{name}/hold",
            "/v1/locks/doc/hold".into(),
            json!({"holderId": "b", "waitSeconds": 0}),
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/Bad_Name/acquire".into(),
            json!({}),
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/nope/acquire".into(),
            json!({}),
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/doc/acquire".into(),
            big.clone(),
        ),
        (
            "post",
            "/v1/locks/{name}/release",
            "/v1/locks/doc/release".into(),
            big.clone(),
        ),
        (
            "post",
            "/v1/locks/{name}/heartbeat",
            "/v1/locks/doc/heartbeat".into(),
            big,
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/pair/acquire".into(),
            json!({"holderId": "m", "with": ["pair-2"], "waitSeconds": 0}),
        ),
        ("get", "/v1/locks/{name}", "/v1/locks/pair-2".into(), Value::Null),
        ("get", "/v1/locks/{name}", "/v1/locks/doc".into(), Value::Null),
        ("get", "/v1/locks/{name}", "/v1/locks/nope".into(), Value::Null),
        ("get", "/v1/locks", "/v1/locks".into(), Value::Null),
        (
            "get",
            "/v1/locks/{name}/fence",
            "/v1/locks/doc/fence?token=1".into(),
            Value::Null,
        ),
        (
            "get",
            "/v1/locks/{name}/fence",
            "/v1/locks/doc/fence?token=one".into(),
            Value::Null,
        ),
        (
            "get",
            "/v1/locks/{name}/watch",
            "/v1/locks/nope/watch".into(),
            Value::Null,
        ),
        (
            "get",
            "/v1/locks/{name}/watch",
            "/v1/locks/doc/watch?keepAliveSeconds=0".into(),
            Value::Null,
        ),
        (
            "post",
            "/v1/locks/{name}/heartbeat",
            "/v1/locks/doc/heartbeat".into(),
            json!({}),
        ),
        (
            "post",
            "/v1/locks/{name}/heartbeat",
            "/v1/locks/doc/heartbeat".into(),
            json!({"holderId": "b"}),
        ),
        (
            "post",
            "/v1/locks/{name}/release",
            "/v1/locks/doc/release".into(),
            json!({"holderId": "b"}),
        ),
        (
            "post",
            "/v1/locks/{name}/release",
            "/v1/locks/doc/release".into(),
            json!({}),
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/beat/acquire".into(),
            json!({}),
        ),
        ("sleep", "", String::new(), Value::Null),
        (
            "post",
            "/v1/locks/{name}/heartbeat",
            "/v1/locks/beat/heartbeat".into(),
            json!({}),
        ),
        ("get", "/healthz", "/healthz".into(), Value::Null),
        ("get", "/readyz", "/readyz".into(), Value::Null),
        ("get", "/metrics", "/metrics".into(), Value::Null),
        ("stop-etcd", "", String::new(), Value::Null),
        ("get", "/readyz", "/readyz".into(), Value::Null),
        ("get", "/v1/locks/{name}", "/v1/locks/doc".into(), Value::Null),
        (
            "get",
            "/v1/locks/{name}/fence",
            "/v1/locks/doc/fence?token=1".into(),
            Value::Null,
        ),
        (
            "get",
            "/v1/locks/{name}/watch",
            "/v1/locks/doc/watch".into(),
            Value::Null,
        ),
        (
            "post",
            "/v1/locks/{name}/acquire",
            "/v1/locks/doc/acquire".into(),
            json!({"holderId": "c"}),
        ),
    ];
    let http = reqwest::Client::new();
    let mut exercised = BTreeSet::new();
    let hold = http.post(format!("{}/v1/locks/streamed/hold", s.addr));
    first_event_fits(&spec, hold.send().await.unwrap(), "/v1/locks/{name}/hold", "post").await;
    exercised.insert(("/v1/locks/{name}/hold".into(), "post".into()));
    for (method, path, url, body) in calls {
        match method {
            "sleep" => {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                continue;
            }
            "stop-etcd" => {
                etcd.stop();
                continue;
            }
            _ => {}
        }
        let req = if method == "get" {
            http.get(format!("{}{url}", s.addr))
        } else {
            http.post(format!("{}{url}", s.addr))
        };
        let resp = if body.is_null() { req } else { req.json(&body) }
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        let text = resp.text().await.unwrap();
        let (doc_type, schema) = documented(&spec, path, method, status).unwrap();
        assert!(
            ctype.starts_with(doc_type),
            "{method} {url}: content-type {ctype}, documented {doc_type}"
        );
        if doc_type == "application/json" {
            let value: Value = serde_json::from_str(&text).unwrap();
            check(&spec, schema, &value, &format!("{method} {url} {status}")).unwrap();
        }
        exercised.insert((path.to_string(), method.to_string()));
    }
    // The events stream: its data fits HoldEvent; the watch's first event, HolderSet.
    first_event_fits(&spec, events, "/v1/locks/{name}/events", "get").await;
    exercised.insert(("/v1/locks/{name}/events".into(), "get".into()));
    first_event_fits(&spec, watch, "/v1/locks/{name}/watch", "get").await;

    let documented_ops: BTreeSet<(String, String)> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (p.clone(), m.clone()))
        })
        .collect();
    assert_eq!(
        documented_ops, exercised,
        "documented operations and exercised ones differ"
    );
}
