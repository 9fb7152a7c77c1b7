//! The protocol model: podlock's queue protocol (enqueue, position, wait, grant, record,
//! release, leases, the operator, settings changes, modes, etcd wiped or restored under the
//! locks and the token epoch that keeps fencing tokens rising) as a Stateright model, checked for
//! the configurations in [`runs`]. Positions are decided by the engine's own function
//! (`podlock::lock::protocol`). See docs/design.md, "The protocol model".
//!
//! podlock's test `model` runs it: `cargo test --test model` checks every run and fails if one
//! turns out otherwise than expected, printing the counterexample; `PODLOCK_MODEL=<part of a
//! run's name>` checks only the matching runs. It is a crate of its own so that it can be
//! compiled optimized in the dev profile (Cargo.toml): unoptimized, it explores states 5 to
//! 8 times slower.

mod client;
mod clusters;
mod deadline;
mod decide;
mod handoff;
mod late;
mod liveness;
mod model;
mod multi;
mod permits;
mod props;
mod publishers;
mod rebuild;
mod report;
mod resend;
mod runs;
mod spec;
mod state;
mod view;
mod world;
mod yielding;

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::model::Protocol;
use crate::runs::{Expect, Run, runs};

/// Checks every run (or those `PODLOCK_MODEL` names); fails if one comes out otherwise than
/// expected.
pub fn run() -> ExitCode {
    let filter = std::env::var("PODLOCK_MODEL").unwrap_or_default();
    let started = Instant::now();
    let (mut passed, mut failed) = (0, 0);
    for run in runs().into_iter().filter(|r| r.spec.name.contains(&filter)) {
        if check(run) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("model: {:.1} s in all", started.elapsed().as_secs_f64());
    println!("model: {passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A property that failed, with a path to where it failed.
type Failure = (&'static str, model::Steps);

/// Checks one run; returns whether it came out as expected.
fn check(run: Run) -> bool {
    println!("== {}: {}", run.spec.name, run.about);
    let model = Protocol::new(run.spec);
    let (model, mut failures, reached) = check_safety(model, run.expect);
    let model = &model;
    let missing: Vec<_> = (props::examples(model).into_iter())
        .filter(|e| !reached.contains(e))
        .collect();
    let liveness_expected = match run.expect {
        Expect::Finds(p) => LIVE.contains(&p),
        Expect::Fails(_) => true,
    };
    if liveness_expected {
        failures.extend(check_liveness(model));
    }
    verdict(model, run.expect, failures, &missing)
}

/// The liveness properties' names (see [`props::liveness`]).
const LIVE: [&str; 4] = [props::GRANTED, props::ADMITTED, props::TOLD, props::DRAINS];

/// Stateright's breadth-first search for counterexamples to the `always` properties and
/// examples of the `sometimes` ones; stops at the first counterexample sought, if one is.
/// Returns the model with the counterexamples, and the examples reached.
fn check_safety(model: Protocol, expect: Expect) -> (Protocol, Vec<Failure>, BTreeSet<&'static str>) {
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut builder = model.checker().threads(threads);
    if let Expect::Finds(p) = expect {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([p])));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "   safety (Stateright BFS): {} states, {} unique, depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    let (mut failures, mut reached) = (vec![], BTreeSet::new());
    for (prop, path) in checker.discoveries() {
        if checker.model().property(prop).expectation != Expectation::Always {
            reached.insert(prop);
            continue;
        }
        let path = path.into_vec();
        let steps = path.windows(2).map(|w| (w[0].1.expect("a step"), w[1].0.clone()));
        failures.push((prop, steps.collect()));
    }
    (Protocol::new(checker.model().spec.clone()), failures, reached)
}

/// The liveness check (see [`liveness`]): one counterexample per failing property.
fn check_liveness(model: &Protocol) -> Vec<Failure> {
    let started = Instant::now();
    let outcome = liveness::check(model);
    println!(
        "   liveness (AG EF over good steps): {} unique states, {} good steps, {:.1} s",
        outcome.states,
        outcome.good_edges,
        started.elapsed().as_secs_f64()
    );
    let mut failures: Vec<Failure> = vec![];
    for (prop, client, steps) in outcome.failures {
        println!("   {prop}: fails for c{client}");
        if failures.iter().all(|(p, _)| *p != prop) {
            failures.push((prop, steps));
        }
    }
    failures
}

/// Prints what was found against what was expected; returns whether they agree.
fn verdict(model: &Protocol, expect: Expect, failures: Vec<Failure>, missing: &[&str]) -> bool {
    let start = model.init();
    let expected = |prop: &str| match expect {
        Expect::Finds(p) => p == prop,
        Expect::Fails(props) => props.contains(&prop),
    };
    for (prop, steps) in &failures {
        let (label, full) = match expected(prop) {
            true => ("counterexample, as expected", false),
            false => ("VIOLATED", true),
        };
        println!("   {prop}: {label} ({} steps):", steps.len());
        println!("{}", report::path(model, &start, steps, full));
    }
    let found: BTreeSet<_> = failures.iter().map(|(p, _)| *p).collect();
    let ok = match expect {
        Expect::Finds(p) => found.contains(p),
        Expect::Fails(props) => found == props.iter().copied().collect() && missing.is_empty(),
    };
    if matches!(expect, Expect::Fails(_)) && !missing.is_empty() {
        println!("   NOT REACHED (the run explores too little): {missing:?}");
    }
    let outcome = match (ok, expect) {
        (true, Expect::Fails([])) => "every property holds".to_string(),
        (true, Expect::Fails(props)) => format!("every property holds but {props:?}, as expected"),
        (true, Expect::Finds(p)) => format!("the checker finds the injected bug ({p})"),
        (false, _) => "FAILED".to_string(),
    };
    println!("   verdict: {outcome}");
    ok
}
