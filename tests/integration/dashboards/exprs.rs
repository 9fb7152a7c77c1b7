//! The PromQL of the chart's Grafana dashboard and PrometheusRule, and the metric names it
//! selects, found by parsing it (promql-parser), and the metric families a `/metrics` page
//! exports.

use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, VectorSelector};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The dashboard, as the chart ships it.
pub const DASHBOARD: &str = include_str!("../../../charts/podlock/dashboards/podlock.json");

/// Grafana's variables in the dashboard's queries, and what stands in for them when the query
/// goes to Prometheus itself: every namespace and lock, a rate window of one minute.
const VARIABLES: [(&str, &str); 3] = [("$__rate_interval", "1m"), ("$namespace", ".+"), ("$lock", ".+")];

/// Replaces Grafana's variables; panics on one it does not know, so that a new variable
/// cannot slip past the checks unparsed.
pub fn as_promql(query: &str) -> String {
    let query = VARIABLES
        .iter()
        .fold(query.to_string(), |q, (var, value)| q.replace(var, value));
    assert!(!query.contains('$'), "an unknown Grafana variable in {query}");
    query
}

/// Every query of the dashboard, named by where it is: each panel target's `expr`, and the
/// selector inside each template variable's `label_values(SELECTOR, LABEL)`.
pub fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = vec![];
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("a target's expr");
            queries.push((format!("panel {}", panel["title"]), as_promql(expr)));
        }
    }
    for var in dashboard["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = var["query"]["query"].as_str() {
            let inner = q.strip_prefix("label_values(").expect("a label_values query");
            let (selector, _label) = inner.rsplit_once(',').expect("label_values(SELECTOR, LABEL)");
            queries.push((format!("variable {}", var["name"]), as_promql(selector)));
        }
    }
    queries
}

/// Every alert's expression in the rendered PrometheusRule's `groups`, named by alert.
pub fn rule_queries(groups: &serde_yaml::Value) -> Vec<(String, String)> {
    let groups = groups.as_sequence().expect("groups");
    let rules = groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"));
    rules
        .map(|r| {
            let name = r["alert"].as_str().expect("an alert name");
            (
                format!("alert {name}"),
                r["expr"].as_str().expect("expr").to_string(),
            )
        })
        .collect()
}

/// The metric names `query` selects (by name or by a `__name__="..."` matcher).
pub fn metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
            let selector = match expr {
                Expr::VectorSelector(vs) => vs,
                Expr::MatrixSelector(ms) => &ms.vs,
                _ => return Ok(true),
            };
            self.0.insert(name_of(selector)?);
            Ok(true)
        }
    }
    let expr = parser::parse(query)?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &expr)?;
    Ok(names.0)
}

fn name_of(vs: &VectorSelector) -> Result<String, String> {
    let by_matcher = vs.matchers.matchers.iter().find(|m| m.name == "__name__");
    match (&vs.name, by_matcher) {
        (Some(name), _) => Ok(name.clone()),
        (None, Some(m)) if matches!(m.op, MatchOp::Equal) => Ok(m.value.clone()),
        _ => Err(format!("a selector without one exact metric name: {vs}")),
    }
}

/// The metric families of Prometheus text, by name, with their `# TYPE`.
pub fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// Whether `name` is a series that `families` export: a counter, gauge or untyped family by
/// its own name; a histogram only by its `_bucket`, `_sum` and `_count` series (a bare
/// histogram name selects nothing), a summary by its own name, `_sum` and `_count`.
pub fn exported(families: &BTreeMap<String, String>, name: &str) -> bool {
    if let Some(kind) = families.get(name) {
        return kind != "histogram";
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        let family = name.strip_suffix(suffix).and_then(|f| families.get(f));
        match family.map(String::as_str) {
            Some("histogram") => true,
            Some("summary") => *suffix != "_bucket",
            _ => false,
        }
    })
}

#[test]
fn names_are_found_through_every_kind_of_expression_and_suffixes_matched_to_types() {
    let q = r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~".+"}[1m]))) > 2 * b
        and on (lock) max_over_time({__name__="c"}[5m:1m]) unless (sum(d) or vector(0))"#;
    let names: Vec<_> = metric_names(q).unwrap().into_iter().collect();
    assert_eq!(names, ["a_bucket", "b", "c", "d"]);
    assert!(metric_names("sum(").is_err());
    let fams = families("# TYPE a histogram\n# TYPE b counter\n# TYPE s summary\n");
    assert!(exported(&fams, "a_bucket") && exported(&fams, "a_count") && exported(&fams, "b"));
    assert!(!exported(&fams, "a") && !exported(&fams, "b_bucket") && !exported(&fams, "s_bucket"));
    assert!(exported(&fams, "s") && exported(&fams, "s_sum") && !exported(&fams, "z_count"));
}
