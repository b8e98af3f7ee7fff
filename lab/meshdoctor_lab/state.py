"""The lab's state file contract: what `lab up` wrote, read back by `down`, `status` and the test API server.

state_dir/state.json is the single source of truth about a running lab. The API server serves `pods` as Pod
objects and runs exec/port-forward in `netns`; `down` kills `pids` and deletes the namespaces. Keys may be
added, never renamed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

STATE_FILE = "state.json"
CALLER_POD_SUFFIX = "-caller"


def caller_pod_name(pod: str) -> str:
    """The pod `lab up --caller sidecar` calls lab pod `pod` from: its client and its caller sidecar (process key
    `<pod>/caller`) share the pod's client namespace, which is that pod's network."""
    return pod + CALLER_POD_SUFFIX


class LabError(Exception):
    """A lab operation failed; the message is one line meant for the user (no traceback)."""


@dataclass(frozen=True)
class LabPort:
    """A container port of a lab pod (name as in the pod spec, e.g. `http`, `tcp-echo`)."""

    name: str
    port: int


@dataclass(frozen=True)
class LabPod:
    """One lab pod: a network namespace with the Istio nat rules, apps and Envoy as its istio-proxy.

    `netns` holds the pod (eth0 = `pod_ip`/24, lo); `client_netns` holds the other end of the veth
    (`client_ip`/24), where scenario drivers run as the pod's downstream clients.
    """

    name: str
    scenario: str
    netns: str
    client_netns: str
    pod_ip: str
    client_ip: str
    ports: tuple[LabPort, ...]
    uid: str
    spec_patch: tuple = ()  # RFC 6902 ops the test API server applies to this pod's Pod object (lint tests)
    fix: str = ""  # the printed fix applied to it (lab/fixes.py), "" for none
    annotations: tuple[tuple[str, str], ...] = ()  # the pod template annotations that fix set
    settings: tuple[tuple[str, str], ...] = ()  # the Istio fields it set (Kind.path, value)
    # The pod template's labels the injector reads (the scenario's, then the fix's): the API server renders them
    labels: tuple[tuple[str, str], ...] = ()
    # Where the lab keeps the certificates of a pod whose sidecar speaks mTLS (lab/pki.py), "" for none: the
    # scenario driver reads its callers' certificate there
    certs: str = ""
    # "sidecar" when its client calls it through a caller sidecar (MeshOptions.caller), "" otherwise: a round whose
    # story depends on who holds the connection the pod's sidecar closes (downstream-idle) reads it
    caller: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scenario": self.scenario,
            "netns": self.netns,
            "client_netns": self.client_netns,
            "pod_ip": self.pod_ip,
            "client_ip": self.client_ip,
            "ports": [{"name": p.name, "port": p.port} for p in self.ports],
            "uid": self.uid,
            **({"spec_patch": list(self.spec_patch)} if self.spec_patch else {}),
            **({"fix": self.fix} if self.fix else {}),
            **({"settings": dict(self.settings)} if self.settings else {}),
            **({"labels": dict(self.labels)} if self.labels else {}),
            **({"certs": self.certs} if self.certs else {}),
            **({"caller": self.caller} if self.caller else {}),
            # What the test API server renders into the Pod: the annotations, and istio-init's -d additions.
            **({"annotations": dict(self.annotations),
                "exclude_inbound_ports": [p.strip() for k, v in self.annotations
                                          if k == "traffic.sidecar.istio.io/excludeInboundPorts"
                                          for p in v.split(",") if p.strip()]} if self.annotations else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LabPod":
        return cls(
            name=data["name"],
            scenario=data["scenario"],
            netns=data["netns"],
            client_netns=data["client_netns"],
            pod_ip=data["pod_ip"],
            client_ip=data["client_ip"],
            ports=tuple(LabPort(p["name"], int(p["port"])) for p in data["ports"]),
            uid=data["uid"],
            spec_patch=tuple(data.get("spec_patch") or ()),
            fix=str(data.get("fix", "")),
            annotations=tuple((str(k), str(v)) for k, v in (data.get("annotations") or {}).items()),
            settings=tuple((str(k), str(v)) for k, v in (data.get("settings") or {}).items()),
            labels=tuple((str(k), str(v)) for k, v in (data.get("labels") or {}).items()),
            certs=str(data.get("certs", "")),
            caller=str(data.get("caller", "")),
        )


CALLERS = ("none", "sidecar")  # who calls a lab pod: its scenario driver alone, or through a caller sidecar


@dataclass(frozen=True)
class MeshOptions:
    """Mesh-wide settings every pod's sidecar gets: Istio's ``meshConfig.accessLogEncoding`` (TEXT or JSON),
    and ``legacy_inbound``, the sidecar dialling the app on 127.0.0.1 as Istio < 1.10 did (newer Istio dials the
    pod IP from 127.0.0.6).

    ``caller``: ``none`` (the scenario driver calls the pod in plaintext, as a client without a sidecar) or
    ``sidecar`` (its calls go through a caller sidecar in the client namespace, which speaks Istio mTLS to the
    pod's: lab/caller_sidecar.py); ``caller_retry_503``: that sidecar's default retry policy also retries 503, as
    Istio < 1.24 did.

    Raises ValueError for a caller that is not one of CALLERS.
    """

    access_log_encoding: str = "TEXT"
    legacy_inbound: bool = False
    caller: str = "none"
    caller_retry_503: bool = False

    def __post_init__(self) -> None:
        if self.caller not in CALLERS:
            raise ValueError(f"caller {self.caller!r} is not one of {', '.join(CALLERS)}")

    @property
    def caller_sidecar(self) -> bool:
        return self.caller == "sidecar"

    def to_json(self) -> dict[str, Any]:
        return {"access_log_encoding": self.access_log_encoding, "legacy_inbound": self.legacy_inbound,
                "caller": self.caller, "caller_retry_503": self.caller_retry_503}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "MeshOptions":
        return cls(access_log_encoding=str(data.get("access_log_encoding", "TEXT")),
                   legacy_inbound=bool(data.get("legacy_inbound", False)),
                   caller=str(data.get("caller", "none")),
                   caller_retry_503=bool(data.get("caller_retry_503", False)))


@dataclass(frozen=True)
class LabObservation:
    """What `status` saw right now (never written to state.json)."""

    running: tuple[str, ...]  # pid keys whose process is alive
    dead: tuple[str, ...]  # pid keys whose process is gone
    netns_present: tuple[str, ...]
    netns_missing: tuple[str, ...]


@dataclass(frozen=True)
class EndedRun:
    """One earlier run of a lab process that the lab ended as a container ends: ``started`` and ``finished``
    (seconds since the epoch), the ``exit_code`` the kubelet reports for it (0 for a process that exited on
    SIGTERM, as Envoy and pilot-agent do; 128 + 9 = 137 for one SIGKILLed: a crash, an OOM kill), the kubelet's
    ``reason`` for it ("Completed" for 0, "Error" otherwise: kubelet kuberuntime_container.go) and, for a run the
    kubelet stopped, when it ``asked`` (its SIGTERM: the Killing event)."""

    started: float
    finished: float
    exit_code: int
    asked: float | None = None  # when the kubelet asked it to stop (its SIGTERM; the Killing event), None: a crash

    @property
    def reason(self) -> str:
        return "Completed" if self.exit_code == 0 else "Error"

    def to_json(self) -> dict[str, Any]:
        return {"started": self.started, "finished": self.finished, "exit_code": self.exit_code,
                **({"asked": self.asked} if self.asked is not None else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "EndedRun":
        asked = data.get("asked")
        return cls(float(data["started"]), float(data["finished"]), int(data["exit_code"]),
                   float(asked) if asked is not None else None)


@dataclass(frozen=True)
class LabState:
    """A lab as `up` left it. `pids` maps `<pod>/<role>` (and `apiserver`) to a process id.

    `started` maps the same keys to the process start time (seconds since epoch, as psutil reports it) so
    that `down` never kills a recycled pid. `ended` maps a key to its earlier runs, oldest first, when the lab
    ended and restarted that process as the kubelet restarts a container (the API server's restartCount and
    lastState, and the pod's events, come from it).
    """

    name: str
    namespace: str
    state_dir: Path
    kubeconfig: Path
    netns_prefix: str
    pods: tuple[LabPod, ...]
    pids: Mapping[str, int] = field(default_factory=dict)
    started: Mapping[str, float] = field(default_factory=dict)
    mesh: MeshOptions = MeshOptions()
    observed: LabObservation | None = None
    ended: Mapping[str, tuple[EndedRun, ...]] = field(default_factory=dict)

    def pod(self, name: str) -> LabPod:
        """The pod called `name`; raises KeyError when the lab has none."""
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "state_dir": str(self.state_dir),
            "kubeconfig": str(self.kubeconfig),
            "netns_prefix": self.netns_prefix,
            "pods": [p.to_json() for p in self.pods],
            "pids": dict(self.pids),
            "started": dict(self.started),
            "mesh": self.mesh.to_json(),
            **({"ended": {k: [r.to_json() for r in runs] for k, runs in self.ended.items()}} if self.ended else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LabState":
        return cls(
            name=data["name"],
            namespace=data["namespace"],
            state_dir=Path(data["state_dir"]),
            kubeconfig=Path(data["kubeconfig"]),
            netns_prefix=data.get("netns_prefix", ""),
            pods=tuple(LabPod.from_json(p) for p in data["pods"]),
            pids={k: int(v) for k, v in data.get("pids", {}).items()},
            started={k: float(v) for k, v in data.get("started", {}).items()},
            mesh=MeshOptions.from_json(data.get("mesh") or {}),
            ended={k: tuple(EndedRun.from_json(r) for r in runs) for k, runs in (data.get("ended") or {}).items()},
        )


def write_state(state: LabState) -> Path:
    """Write state_dir/state.json atomically (readers never see half a file); returns its path."""
    path = state.state_dir / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_state(state_dir: Path) -> LabState | None:
    """The state in state_dir, or None when there is no state file.

    Raises ValueError (or KeyError) when the file exists but is not a lab state.
    """
    path = Path(state_dir) / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return LabState.from_json(json.loads(text))
