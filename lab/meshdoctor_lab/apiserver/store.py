"""The server's mutable view of the lab: one record per pod, a resourceVersion counter, change notification."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from meshdoctor_lab.applied_fixes import injected
from meshdoctor_lab.state import STATE_FILE

from .container_status import CONTAINER_ROLES, ProcessRuns, container_events, event_json
from .injection import inject
from .objects import NODE_NAME, STARTED_AFTER, LabConfig, PodSpecIn, deployment_json, pod_json
from .patch import apply_json_patch


@dataclass
class EphemeralState:
    """What the kubelet would report for one ephemeral container (times in seconds since epoch)."""

    name: str
    image: str
    netns: str
    phase: str = "waiting"  # waiting -> running -> terminated
    waiting_reason: str = "ContainerCreating"
    waiting_message: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    pid: int | None = None
    io: Any = None  # a ContainerIO while an interactive (stdin/tty) container runs: what attach connects to

    def status_json(self, pod_uid: str) -> dict[str, Any]:
        from .objects import fake_digest, rfc3339

        cid = "containerd://" + fake_digest(pod_uid, self.name)
        state: dict[str, Any]
        if self.phase == "waiting":
            state = {"waiting": {"reason": self.waiting_reason}}
            if self.waiting_message:
                state["waiting"]["message"] = self.waiting_message
        elif self.phase == "running":
            state = {"running": {"startedAt": rfc3339(self.started_at or time.time())}}
        else:
            state = {"terminated": {
                "containerID": cid,
                "exitCode": self.exit_code if self.exit_code is not None else 0,
                "finishedAt": rfc3339(self.finished_at or time.time()),
                "reason": "Completed" if self.exit_code == 0 else "Error",
                "startedAt": rfc3339(self.started_at or self.finished_at or time.time()),
            }}
        out: dict[str, Any] = {
            "image": self.image,
            "imageID": "",
            "lastState": {},
            "name": self.name,
            "ready": False,
            "restartCount": 0,
            "state": state,
        }
        if self.phase != "waiting":
            out["containerID"] = cid
            out["imageID"] = self.image.rsplit(":", 1)[0] + "@sha256:" + fake_digest(self.image)
        return out


@dataclass
class PodRecord:
    spec: PodSpecIn
    created: float
    resource_version: int
    ephemeral: list[dict[str, Any]] = field(default_factory=list)
    ephemeral_state: dict[str, EphemeralState] = field(default_factory=dict)
    # Serialises PATCHes of one pod so two clients cannot both pass validation with the same name.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def container_names(self) -> list[str]:
        """The names in spec.containers and spec.initContainers (none of Istio's for a pod not injected)."""
        return ["app", "istio-proxy", "istio-init"] if injected(self.spec.labels) else ["app"]


class Store:
    """All lab pods. Bumps resourceVersion on every change and wakes watchers."""

    def __init__(self, config: LabConfig) -> None:
        self.config = config
        self.namespace = config.namespace
        now = time.time()
        self._rv = 1000
        self.pods: dict[str, PodRecord] = {}
        # A real API server lists from etcd, in key order: by name within a namespace.
        for spec in sorted(config.pods, key=lambda spec: spec.name):
            self._rv += 1
            self.pods[spec.name] = PodRecord(spec=spec, created=config.created(spec.name, now),
                                             resource_version=self._rv)
        self.changed = asyncio.Condition()
        self.runs = ProcessRuns(config.state_dir / STATE_FILE if config.state_dir else None)

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, namespace: str, name: str) -> PodRecord | None:
        if namespace != self.namespace:
            return None
        return self.pods.get(name)

    async def touch(self, record: PodRecord) -> None:
        """Record a change of `record` (new resourceVersion) and wake everyone waiting on `changed`."""
        self._rv += 1
        record.resource_version = self._rv
        async with self.changed:
            self.changed.notify_all()

    def pod_json(self, record: PodRecord) -> dict[str, Any]:
        statuses = [record.ephemeral_state[c["name"]].status_json(record.spec.uid)
                    for c in record.ephemeral if c["name"] in record.ephemeral_state]
        runs = {c: self.runs.of(record.spec.name, c) for c in CONTAINER_ROLES}
        obj = pod_json(record.spec, self.namespace, record.created, record.resource_version,
                       record.ephemeral, statuses, runs)
        # The patch stands for the user's pod template (a lint test's broken spec); injection comes after it.
        return inject(apply_json_patch(obj, record.spec.spec_patch) if record.spec.spec_patch else obj)

    def events_json(self, record: PodRecord) -> list[dict[str, Any]]:
        """The kubelet's events about the pod's containers (container_status.py), oldest first."""
        pod = self.pod_json(record)
        out = []
        for where in ("containers", "initContainers"):
            for container in pod["spec"].get(where, ()):
                name = container["name"]
                if name not in CONTAINER_ROLES:
                    continue
                runs = self.runs.of(record.spec.name, name)
                for i, (ts, reason, message) in enumerate(container_events(runs, name,
                                                                           record.created + STARTED_AFTER)):
                    out.append(event_json(pod, name, f"spec.{where}", i, ts, reason, message, NODE_NAME,
                                          self._rv))
        return sorted(out, key=lambda e: e["lastTimestamp"])

    def deployment_json(self, record: PodRecord) -> dict[str, Any]:
        return deployment_json(record.spec, self.namespace, record.created, record.resource_version)
