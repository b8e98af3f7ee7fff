"""The kubelet's events about a pod's containers, read from the API server for the detectors' timeline.

``kubectl describe pod`` shows the same list: core/v1 Events whose ``involvedObject`` is the pod, each naming a
container in ``involvedObject.fieldPath`` (``spec.containers{istio-proxy}``, ``spec.initContainers{...}`` for a
native sidecar). A container restart shows as Created and Started again; the kubelet stopping one (pod deletion,
a failed liveness probe) as Killing "Stopping container NAME"; a crash loop as BackOff (pkg/kubelet/events/
event.go; kuberuntime_container.go). Events live one hour by default (the API server's --event-ttl): an older
restart is known only by the container status's restartCount and lastState.
"""

from __future__ import annotations

import re

from .client import Kube, api_call

_FIELD_PATH = re.compile(r"spec\.(?:initContainers|containers|ephemeralContainers)\{([^}]+)\}")
MAX_EVENTS = 500  # a pod's events the run keeps: the newest, when a crash loop made more


# (lastTimestamp in seconds since the epoch, container, reason, message, count): core/events.py ContainerEvent's
# fields, for kube/ is a leaf
KubeletEvent = tuple[float, str, str, str, int]


def container_events(kube: Kube, namespace: str, name: str, uid: str | None) -> tuple[KubeletEvent, ...]:
    """The kubelet's events about pod ``name``'s containers, oldest first (at most MAX_EVENTS, the newest).
    Raises KubeError (not allowed to list events, the server unreachable)."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
    items = api_call(kube, f"listing the events of pod/{name}", kube.core.list_namespaced_event, namespace,
                     field_selector=selector).items or []
    out = []
    for e in items:
        where = _FIELD_PATH.fullmatch((e.involved_object.field_path or "") if e.involved_object else "")
        when = e.last_timestamp or e.event_time or e.first_timestamp or (e.metadata and e.metadata.creation_timestamp)
        if where is None or when is None:
            continue  # about the pod as a whole (Scheduled, FailedMount), or of no time
        out.append((when.timestamp(), where.group(1), e.reason or "", e.message or "", int(e.count or 1)))
    return tuple(sorted(out)[-MAX_EVENTS:])
