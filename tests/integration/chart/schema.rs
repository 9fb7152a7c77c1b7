//! The values schema: a wrong value is refused, naming its field.

use super::{CHART, KUBE_VERSION, helm};

#[test]
fn bad_values_fail_naming_the_field() {
    for (set, field) in [
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
    ] {
        let args = [
            "template",
            "podlock",
            CHART,
            "--kube-version",
            KUBE_VERSION,
            "--set",
            set,
        ];
        let (ok, _, err) = helm(&args);
        assert!(!ok, "--set {set} was accepted");
        assert!(
            err.contains(field),
            "--set {set}: error does not name {field}: {err}"
        );
    }
}
