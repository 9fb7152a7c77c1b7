//! `spec.holderService`: a Service without a selector, and one EndpointSlice that the operator
//! keeps equal to the pods holding the lock, so that an active/passive system reaches its
//! current leader through a plain Service and the route follows every handoff.
//!
//! The slice is written in the same reconciliation that mirrors the new holder into `status`,
//! before the status, so traffic moves as soon as the operator sees the handoff.

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, Preconditions};
use kube::{Resource, ResourceExt};
use tracing::info;

use crate::crd::{DistributedLock, Holder, HolderService, HolderServiceStatus};
use crate::operator::owner::server_side_apply;

/// The label on every Service and EndpointSlice the operator makes for a lock; it watches only
/// objects that carry it (the owner reference names the lock).
pub const LABEL: &str = "podlock.io/holder-service";

/// The EndpointSlice's `endpointslice.kubernetes.io/managed-by`, which tells Kubernetes' own
/// EndpointSlice controllers to leave it alone.
const MANAGED_BY: &str = "podlock.io";

/// The condition type that says whether the holder Service routes to the holders.
pub const CONDITION: &str = "HolderService";

/// What following the holders came to.
pub enum Followed {
    /// The Service routes to the holders' pods.
    Routing(HolderServiceStatus),
    /// A Service of that name exists that the operator did not make; it is left alone.
    NameTaken(String),
}

impl Followed {
    /// The `HolderService` condition's status, reason and message.
    pub fn condition(&self) -> (&'static str, &'static str, String) {
        match self {
            Followed::Routing(s) => (
                "True",
                "Routing",
                format!("Service {} routes to {} holder pod(s)", s.name, s.addresses.len()),
            ),
            Followed::NameTaken(name) => (
                "False",
                "ServiceNameTaken",
                format!(
                    "a Service named {name} exists that podlock did not make; set another \
                     spec.holderService.name or delete that Service"
                ),
            ),
        }
    }
}

/// Makes the lock's holder Service and its EndpointSlice route to `holders`, or removes the
/// ones `old` names when `spec.holderService` no longer asks for them. `None`: no Service is
/// asked for.
pub async fn follow(
    client: &kube::Client,
    dl: &DistributedLock,
    old: Option<&HolderServiceStatus>,
    holders: &[Holder],
) -> Result<Option<Followed>, kube::Error> {
    let ns = dl.namespace().unwrap_or_default();
    let spec = dl.spec.holder_service.as_ref();
    let name = spec.map(|s| s.name.clone().unwrap_or_else(|| dl.name_any()));
    if let Some(old) = old.filter(|o| Some(&o.name) != name.as_ref()) {
        remove(client, dl, &ns, &old.name).await?;
    }
    let (Some(spec), Some(name)) = (spec, name) else {
        return Ok(None);
    };
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let existing = services.get_opt(&name).await?;
    if existing.as_ref().is_some_and(|svc| !made_for(svc, dl)) {
        return Ok(Some(Followed::NameTaken(name)));
    }
    let family = match existing.filter(|svc| ports_match(svc, spec)) {
        Some(svc) => family(&svc),
        None => family(
            &services
                .patch(
                    &name,
                    &server_side_apply(),
                    &Patch::Apply(service(dl, &name, spec)),
                )
                .await?,
        ),
    };
    let endpoints = endpoints(client, &ns, holders, &family).await?;
    let addresses = endpoints
        .iter()
        .filter_map(|e| e.addresses.first().cloned())
        .collect();
    let slice = slice(dl, &name, spec, &family, endpoints);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    slices
        .patch(&slice_name(&name), &server_side_apply(), &Patch::Apply(slice))
        .await?;
    Ok(Some(Followed::Routing(HolderServiceStatus { name, addresses })))
}

fn slice_name(service: &str) -> String {
    format!("{service}-holders")
}

/// Whether `obj` is one the operator made for this lock (its controller is the lock).
fn made_for<K: Resource>(obj: &K, dl: &DistributedLock) -> bool {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == dl.metadata.uid.as_ref())
}

/// The Service's ports as Kubernetes spells them.
fn service_ports(spec: &HolderService) -> Vec<ServicePort> {
    let ports = spec.ports.iter().map(|p| ServicePort {
        name: Some(p.name.clone().unwrap_or_default()),
        port: p.port.into(),
        target_port: Some(IntOrString::Int(p.target_port.unwrap_or(p.port).into())),
        protocol: Some(p.protocol.as_str().into()),
        ..ServicePort::default()
    });
    ports.collect()
}

/// Whether the Service already has the ports asked for (then it is not written again).
fn ports_match(svc: &Service, spec: &HolderService) -> bool {
    // Compared as the API server returns them: an empty name left out, the protocol defaulted.
    let key = |p: &ServicePort| {
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        (
            p.name.clone().unwrap_or_default(),
            p.port,
            p.target_port.clone(),
            protocol,
        )
    };
    let have = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
    let have: Vec<_> = have.into_iter().flatten().map(key).collect();
    have == service_ports(spec).iter().map(key).collect::<Vec<_>>()
}

/// The metadata of the Service or slice `name`: the operator's labels and `extra`, and the
/// lock as its controller.
fn metadata(dl: &DistributedLock, name: String, extra: &[(&str, &str)]) -> ObjectMeta {
    let ours = [(LABEL, "true"), ("app.kubernetes.io/managed-by", "podlock")];
    let labels = ours
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()));
    ObjectMeta {
        name: Some(name),
        labels: Some(labels.collect()),
        owner_references: dl.controller_owner_ref(&()).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

fn service(dl: &DistributedLock, name: &str, spec: &HolderService) -> Service {
    Service {
        metadata: metadata(dl, name.into(), &[]),
        // No selector: the operator, not the EndpointSlice controller, chooses the endpoints.
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(service_ports(spec)),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The Service's first IP family: the EndpointSlice's address type.
fn family(svc: &Service) -> String {
    let families = svc.spec.as_ref().and_then(|s| s.ip_families.as_ref());
    families
        .and_then(|f| f.first().cloned())
        .unwrap_or_else(|| "IPv4".into())
}

fn slice(
    dl: &DistributedLock,
    service: &str,
    spec: &HolderService,
    family: &str,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let labels = [
        ("kubernetes.io/service-name", service),
        ("endpointslice.kubernetes.io/managed-by", MANAGED_BY),
    ];
    let ports = spec.ports.iter().map(|p| EndpointPort {
        name: Some(p.name.clone().unwrap_or_default()),
        port: Some(p.target_port.unwrap_or(p.port).into()),
        protocol: Some(p.protocol.as_str().into()),
        ..EndpointPort::default()
    });
    EndpointSlice {
        metadata: metadata(dl, slice_name(service), &labels),
        address_type: family.into(),
        ports: Some(ports.collect()),
        endpoints,
    }
}

/// One endpoint per holder pod (a pod holding twice counts once) that has an IP of `family`.
/// A holder is ready whatever its readiness probe says: holding the lock is what makes it the
/// one to route to. A pod being deleted is serving but not ready, as Kubernetes marks it.
async fn endpoints(
    client: &kube::Client,
    ns: &str,
    holders: &[Holder],
    family: &str,
) -> Result<Vec<Endpoint>, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut names: Vec<&str> = vec![];
    for h in holders {
        if !names.contains(&h.pod.as_str()) {
            names.push(&h.pod);
        }
    }
    let mut endpoints = Vec::new();
    for name in names {
        let Some(pod) = pods.get_opt(name).await? else {
            info!(
                namespace = ns,
                pod = name,
                "a holder's pod is gone; not routing to it"
            );
            continue;
        };
        let ips = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ips.clone())
            .unwrap_or_default();
        let Some(ip) = ips
            .into_iter()
            .map(|i| i.ip)
            .find(|ip| ip.contains(':') == (family == "IPv6"))
        else {
            continue;
        };
        let terminating = pod.metadata.deletion_timestamp.is_some();
        endpoints.push(Endpoint {
            addresses: vec![ip],
            conditions: Some(EndpointConditions {
                ready: Some(!terminating),
                serving: Some(true),
                terminating: Some(terminating),
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: pod.metadata.uid,
                ..ObjectReference::default()
            }),
            node_name: pod.spec.and_then(|s| s.node_name),
            ..Endpoint::default()
        });
    }
    Ok(endpoints)
}

/// Deletes the Service `name` and its EndpointSlice if the operator made them for this lock.
async fn remove(
    client: &kube::Client,
    dl: &DistributedLock,
    ns: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    if let Some(svc) = services.get_opt(name).await?.filter(|s| made_for(s, dl)) {
        delete(&services, name, svc.metadata.uid).await?;
    }
    let slice = slice_name(name);
    if let Some(s) = slices.get_opt(&slice).await?.filter(|s| made_for(s, dl)) {
        delete(&slices, &slice, s.metadata.uid).await?;
    }
    info!(namespace = ns, service = name, lock = %dl.name_any(), "removed the holder Service");
    Ok(())
}

/// Deletes `name` if it is still the object `uid` (not one made again since it was read).
async fn delete<K>(api: &Api<K>, name: &str, uid: Option<String>) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
