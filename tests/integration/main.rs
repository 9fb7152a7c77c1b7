//! Integration tests of the lock engine, sidecar and CLI on a real etcd and real `podlock`
//! processes. No mocks: every test starts its own etcd on free loopback ports.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod api_fuzz;
mod auth_changes;
mod certs;
mod chart;
mod checkz;
mod clusters;
mod clusters_wiped;
mod connection;
mod dashboards;
mod deadline;
mod docs;
mod drain;
mod edges;
mod etcd_rebuild;
mod etcd_tls;
mod etcd_version;
mod examples;
mod failure_modes;
mod fence;
mod force_release;
mod holder_service;
mod injection;
mod isolation;
mod leader;
mod liveness;
mod lock_cmd;
mod modes;
mod multi;
mod openapi;
mod operator;
mod operator_ready;
mod permits;
mod pod_liveness;
mod queue;
mod rbac;
mod reconcile_triggers;
mod requests;
mod restarts;
mod restored_fence;
mod settings_change;
mod setup_script;
mod sidecar_missing;
mod stalled_member;
mod startup;
mod status_size;
mod truthful;
mod watch;
mod watch_sync;
mod yielding;
