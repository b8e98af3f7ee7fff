"""The ephemeral debug container that runs tcpdump in the pod's network namespace.

Ephemeral containers can never be removed from a pod, so we reuse a running ``meshdoctor-*`` container and add
one only when none runs; its own command is a bounded ``sleep`` so it ends by itself (pods/ephemeralcontainers,
Kubernetes >= 1.25; kubernetes/kubernetes pkg/apis/core/validation, kubectl/pkg/cmd/debug/debug.go).
"""

from __future__ import annotations

import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass

from .client import Kube, KubeError, api_call
from .target import SIDECAR

DEFAULT_IMAGE = "docker.io/nicolaka/netshoot:v0.13"  # ships tcpdump, sh, timeout, cat
NAME_PREFIX = "meshdoctor-"
DEFAULT_TTL_S = 3600
_FAILED_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                   "CreateContainerError", "RunContainerError"}


@dataclass(frozen=True, slots=True)
class DebugContainer:
    name: str
    reused: bool


def _statuses(pod) -> dict:
    return {s.name: s for s in (pod.status.ephemeral_container_statuses or [])} if pod.status else {}


def running_debug_container(pod) -> str | None:
    """The name of a running ``meshdoctor-*`` ephemeral container in ``pod``, if any."""
    statuses = _statuses(pod)
    for c in pod.spec.ephemeral_containers or []:
        st = statuses.get(c.name)
        if c.name.startswith(NAME_PREFIX) and st is not None and st.state and st.state.running:
            return c.name
    return None


PROFILES = {"least": ["NET_RAW"], "netadmin": ["NET_ADMIN", "NET_RAW"]}  # like kubectl debug --profile


def container_spec(name: str, image: str, ttl_s: int, profile: str = "least") -> dict:
    """The ephemeral container we add: least privilege by default (NET_RAW for tcpdump; ``netadmin`` adds
    NET_ADMIN, e.g. to read iptables), a bounded sleep as its command so it ends by itself."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", str(int(ttl_s))],
        "stdin": False,
        "tty": False,
        "targetContainerName": SIDECAR,
        "terminationMessagePolicy": "File",
        "securityContext": {"capabilities": {"add": list(PROFILES[profile])}},
    }


def new_container_name() -> str:
    return NAME_PREFIX + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


def ensure_debug_container(kube: Kube, pod, image: str = DEFAULT_IMAGE, ttl_s: int = DEFAULT_TTL_S,
                           wait_s: float = 120.0, progress: Callable[[str], None] = lambda s: None,
                           profile: str = "least") -> DebugContainer:
    """Reuse a running ``meshdoctor-*`` ephemeral container or add one and wait (``wait_s`` seconds) until it runs.

    Raises KubeError when the PATCH is refused (RBAC, PodSecurity admission), the image cannot be pulled, or the
    container does not run in time.
    """
    ns, pod_name = pod.metadata.namespace, pod.metadata.name
    existing = running_debug_container(pod)
    if existing:
        progress(f"reusing ephemeral container {existing} in pod/{pod_name}")
        return DebugContainer(existing, reused=True)
    name = new_container_name()
    progress(f"adding ephemeral container {name} ({image}) to pod/{pod_name}")
    body = {"spec": {"ephemeralContainers": [container_spec(name, image, ttl_s, profile)]}}
    api_call(kube, f"cannot add the debug container to pod/{pod_name}",
             kube.core.patch_namespaced_pod_ephemeralcontainers, pod_name, ns, body,
             not_found=f"ephemeral containers are disabled for this cluster, or pod/{pod_name} is gone")
    deadline = time.monotonic() + wait_s
    last_reason = "not started yet"
    while time.monotonic() < deadline:
        current = api_call(kube, f"reading pod/{pod_name}", kube.core.read_namespaced_pod, pod_name, ns,
                           not_found=f"pod/{pod_name} was deleted while its debug container started")
        st = _statuses(current).get(name)
        if st is not None and st.state is not None:
            if st.state.running:
                return DebugContainer(name, reused=False)
            if st.state.terminated:
                t = st.state.terminated
                raise KubeError(f"debug container {name} exited ({t.reason}, code {t.exit_code}) before capture")
            if st.state.waiting:
                w = st.state.waiting
                last_reason = w.reason or "waiting"
                if w.reason in _FAILED_WAITING:
                    raise KubeError(f"debug container {name} cannot start: {w.reason}: {w.message or image}")
        progress(f"waiting for ephemeral container {name}: {last_reason}")
        time.sleep(0.5)  # polling the API: there is no cheaper way to wait on a status change without a watch
    raise KubeError(f"debug container {name} did not start within {wait_s:.0f} s ({last_reason})")
