//! The values schema: a wrong value is refused, naming its field.

use super::{CHART, EXTERNAL_ETCD, KUBE_VERSION, helm};

/// Values of the wrong type or out of range, each with the field its error must name.
const BAD_VALUES: &[(&str, &str)] = &[
    ("operator.replicas=0", "/operator/replicas"),
    ("operator.leaderLeaseSeconds=1", "/operator/leaderLeaseSeconds"),
    (
        "operator.leaderRenewDeadlineSeconds=15",
        "operator.leaderRenewDeadlineSeconds",
    ),
    ("etcd.endpoints[0]=etcd:2379", "/etcd/endpoints/0"),
    ("operator.logFormat=xml", "/operator/logFormat"),
    ("operatr.replicas=2", "operatr"),
    ("image.digest=latest", "/image/digest"),
    ("imagePullSecrets[0].nam=x", "/imagePullSecrets/0"),
    (
        "etcd.bundled.quotaBackendBytes=1024",
        "/etcd/bundled/quotaBackendBytes",
    ),
    ("dashboards.labelValue=a b", "/dashboards/labelValue"),
    (
        "prometheusRule.heldTooLong.factor=1",
        "/prometheusRule/heldTooLong/factor",
    ),
    // The settings common clusters need (issue #41), each of the wrong type or value.
    (
        "metrics.serviceMonitor.labels=kps",
        "/metrics/serviceMonitor/labels",
    ),
    (
        "metrics.podMonitor.labels.release[0]=kps",
        "/metrics/podMonitor/labels/release",
    ),
    ("prometheusRule.labels=kps", "/prometheusRule/labels"),
    (
        "etcd.bundled.storageClassName[0]=fast",
        "/etcd/bundled/storageClassName",
    ),
    (
        "etcd.bundled.storageClassName=Fast SSD",
        "/etcd/bundled/storageClassName",
    ),
    ("etcd.bundled.logLevel=verbose", "/etcd/bundled/logLevel"),
    (
        "etcd.bundled.resources.requests.cpu=lots",
        "/etcd/bundled/resources/requests/cpu",
    ),
    ("etcd.bundled.affinity=near", "/etcd/bundled/affinity"),
    ("etcd.bundled.tolerations.key=x", "/etcd/bundled/tolerations"),
    (
        "etcd.bundled.nodeSelector.disk[0]=ssd",
        "/etcd/bundled/nodeSelector/disk",
    ),
    (
        "etcd.bundled.priorityClassName[0]=high",
        "/etcd/bundled/priorityClassName",
    ),
    ("operator.affinity.nodeAfinity.x=1", "/operator/affinity"),
    (
        "operator.tolerations[0].operator=Maybe",
        "/operator/tolerations/0/operator",
    ),
    ("operator.nodeSelector=linux", "/operator/nodeSelector"),
    (
        "operator.resources.limits.memory=lots",
        "/operator/resources/limits/memory",
    ),
    ("operator.resources.limit.memory=1Gi", "/operator/resources"),
    ("operator.priorityClassName=High", "/operator/priorityClassName"),
    ("operator.logLevel=verbose", "/operator/logLevel"),
    ("sidecar.logLevel=loud", "/sidecar/logLevel"),
    (
        "sidecar.resources.requests.memory=16MB",
        "/sidecar/resources/requests/memory",
    ),
    ("sidecar.resources=small", "/sidecar/resources"),
    ("webhook.timeoutSeconds=31", "/webhook/timeoutSeconds"),
    ("webhook.timeoutSeconds=five", "/webhook/timeoutSeconds"),
    (
        "webhook.namespaceSelector.matchLabels=team",
        "/webhook/namespaceSelector/matchLabels",
    ),
    (
        "webhook.namespaceSelector.matchExpressions[0].operator=Has",
        "/webhook/namespaceSelector/matchExpressions/0",
    ),
    ("webhook.failurePolicy=ignore", "/webhook/failurePolicy"),
    ("operator.hostNetwork=yes", "/operator/hostNetwork"),
    // The knobs of issue #55, item 6.
    ("podLabels.app\\.kubernetes\\.io/name=x", "/podLabels"),
    ("podAnnotations.a[0]=b", "/podAnnotations/a"),
    ("podSecurityContext.runAsUser=-1", "/podSecurityContext/runAsUser"),
    ("podSecurityContext.runAsUsr=1", "/podSecurityContext"),
    (
        "containerSecurityContext.capabilities.drop=ALL",
        "/containerSecurityContext/capabilities/drop",
    ),
    ("operator.extraArgs[0]=shutdown", "/operator/extraArgs/0"),
    (
        "operator.topologySpreadConstraints[0].maxSkew=1",
        "/operator/topologySpreadConstraints/0",
    ),
    (
        "etcd.bundled.topologySpreadConstraints[0].whenUnsatisfiable=Never",
        "/etcd/bundled/topologySpreadConstraints/0",
    ),
    ("sidecar.image=a b", "/sidecar/image"),
    ("sidecar.port=80", "/sidecar/port"),
    (
        "sidecar.imagePullSecrets[0].name=Reg",
        "/sidecar/imagePullSecrets/0/name",
    ),
    (
        "sidecar.securityContext.runAsUser=root",
        "/sidecar/securityContext/runAsUser",
    ),
    ("test.nodeSelector=linux", "/test/nodeSelector"),
    ("test.affinty.x=1", "/test"),
    ("global=x", "/global"),
    (
        "webhook.objectSelector.matchLabel.app=x",
        "/webhook/objectSelector",
    ),
];

#[test]
fn bad_values_fail_naming_the_field() {
    for &(set, field) in BAD_VALUES {
        let mut args = vec!["template", "podlock", CHART, "--kube-version", KUBE_VERSION];
        args.extend(EXTERNAL_ETCD);
        args.extend(["--set", set]);
        let (ok, _, err) = helm(&args);
        assert!(!ok, "--set {set} was accepted");
        assert!(
            err.contains(field),
            "--set {set}: error does not name {field}: {err}"
        );
    }
}
