"""A lab pod's container statuses and the kubelet's events for them, from the lab's own processes.

The lab records when it started each process (state.json ``started``) and each run it ended as a container ends
(``ended``: lab/processes.py end_run). The API server reads both when the file changes, so that a restart the
lab drives (startup.restart_caller_sidecar: istio-proxy killed and started again) shows as the kubelet shows it:

- ``status.containerStatuses[]``: ``restartCount`` (the runs ended), ``lastState.terminated`` (the run before
  this one: exitCode, reason, startedAt, finishedAt, containerID), ``state.running.startedAt`` (this run), or
  ``state.terminated`` while the container is down;
- core/v1 Events whose ``involvedObject`` is the pod and ``fieldPath`` the container (``spec.containers{NAME}``):
  ``Created`` ("Created container: NAME") and ``Started`` ("Started container NAME") at each run's start,
  ``Killing`` ("Stopping container NAME") when the kubelet asked a run to stop (its SIGTERM), none for a
  crash; the kubelet's reasons and messages (pkg/kubelet/events/event.go; kuberuntime_container.go
  startContainer, killContainer).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from meshdoctor_lab.state import CALLER_POD_SUFFIX, EndedRun

# The lab's process roles that are a pod's containers (processes.py _CONTAINER_OF_ROLE); a caller pod's Envoy is
# its istio-proxy (key `<pod>/caller`, read as `<pod>-caller/istio-proxy`).
CONTAINER_ROLES = {"app": ("app-http", "app-tcp"), "istio-proxy": ("sidecar", "istio-proxy")}


def rfc3339(ts: float) -> str:
    """Seconds since epoch -> `2026-08-20T09:14:07Z` (the API's second-precision timestamps)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def fake_digest(*parts: str) -> str:
    """A stable 64-hex id (container ids, image digests) derived from `parts`."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def process_key(key: str) -> str:
    """A state key as the pods the API server serves name it: `<pod>/caller` -> `<pod>-caller/istio-proxy`."""
    pod, _, role = key.partition("/")
    return f"{pod}{CALLER_POD_SUFFIX}/istio-proxy" if role == "caller" else key


@dataclass(frozen=True)
class ContainerRuns:
    """One container's runs: ``current`` when its running process started (seconds since the epoch; None when
    the lab does not run it as a process of its own), ``ended`` its earlier runs, oldest first."""

    current: float | None = None
    ended: tuple[EndedRun, ...] = ()

    def started(self, default: float) -> float:
        """When the running process started (``default`` when the lab has none of its own): never before the
        previous run finished, which psutil's start time (whole seconds of the boot time, /proc/stat btime,
        plus clock ticks) may put it up to a second before."""
        start = self.current if self.current is not None else default
        return max(start, self.ended[-1].finished) if self.ended else start

    @property
    def running(self) -> bool:
        # end_run leaves the ended process's start in `started` until the next start replaces it
        return not self.ended or (self.current is not None and self.current > self.ended[-1].started)


class ProcessRuns:
    """The state file's ``started`` and ``ended``, read again whenever the file changes (by mtime and size)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._seen: tuple[int, int] | None = None
        self._started: dict[str, float] = {}
        self._ended: dict[str, tuple[EndedRun, ...]] = {}

    def _refresh(self) -> None:
        if self._path is None:
            return
        try:
            st = os.stat(self._path)
            if (st.st_mtime_ns, st.st_size) == self._seen:
                return
            data = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return  # mid-replace or gone: keep what was read last
        self._seen = (st.st_mtime_ns, st.st_size)
        self._started = {process_key(k): float(v) for k, v in (data.get("started") or {}).items()}
        self._ended = {process_key(k): tuple(EndedRun.from_json(r) for r in runs)
                       for k, runs in (data.get("ended") or {}).items()}

    def of(self, pod: str, container: str) -> ContainerRuns:
        """Container ``container`` of pod ``pod``: its runs (no runs known: ``ContainerRuns()``)."""
        self._refresh()
        keys = [f"{pod}/{role}" for role in CONTAINER_ROLES.get(container, ())]
        starts = [self._started[k] for k in keys if k in self._started]
        ended: list[EndedRun] = []
        for r in sorted((r for k in keys for r in self._ended.get(k, ())), key=lambda r: r.started):
            # never started before the run before it finished (psutil's whole-second btime: ContainerRuns.started)
            ended.append(replace(r, started=max(r.started, ended[-1].finished)) if ended else r)
        return ContainerRuns(max(starts) if starts else None, tuple(ended))


def _terminated(uid: str, name: str, run: EndedRun, index: int) -> dict[str, Any]:
    return {"containerID": "containerd://" + fake_digest(uid, name, str(index)), "exitCode": run.exit_code,
            "finishedAt": rfc3339(run.finished), "reason": run.reason, "startedAt": rfc3339(run.started)}


def container_status(uid: str, name: str, image: str, runs: ContainerRuns, default_started: float,
                     ready: bool = True) -> dict[str, Any]:
    """``status.containerStatuses[]`` of container ``name`` (core/v1 ContainerStatus): ``default_started`` is its
    start when the lab has no process of its own for it."""
    ended = runs.ended
    running = runs.running
    last = ended[-1] if ended and running else (ended[-2] if len(ended) > 1 else None)
    state = ({"running": {"startedAt": rfc3339(runs.started(default_started))}} if running
             else {"terminated": _terminated(uid, name, ended[-1], len(ended) - 1)})
    return {
        "containerID": "containerd://" + fake_digest(uid, name, *([str(len(ended))] if ended else [])),
        "image": image,
        "imageID": image.rsplit(":", 1)[0] + "@sha256:" + fake_digest(image),
        "lastState": {"terminated": _terminated(uid, name, last, ended.index(last))} if last else {},
        "name": name,
        "ready": ready and running,
        "restartCount": len(ended),
        "started": running,
        "state": state,
    }


def container_events(runs: ContainerRuns, name: str, default_started: float) -> list[tuple[float, str, str]]:
    """The kubelet's events for container ``name``'s runs, as (seconds since the epoch, reason, message)."""
    out: list[tuple[float, str, str]] = []
    starts = [r.started for r in runs.ended] + ([runs.started(default_started)] if runs.running else [])
    for ts in starts:
        out += [(ts, "Created", f"Created container: {name}"), (ts, "Started", f"Started container {name}")]
    out += [(r.asked, "Killing", f"Stopping container {name}") for r in runs.ended if r.asked is not None]
    return sorted(out)


def event_json(pod: Mapping[str, Any], container: str, field_path: str, index: int, ts: float, reason: str,
               message: str, node: str, resource_version: int) -> dict[str, Any]:
    """One core/v1 Event of the kubelet about container ``container`` of Pod object ``pod``."""
    meta = pod["metadata"]
    digest = fake_digest("event", meta["uid"], container, str(index))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "count": 1,
        "eventTime": None,
        "firstTimestamp": rfc3339(ts),
        "lastTimestamp": rfc3339(ts),
        "involvedObject": {"apiVersion": "v1", "fieldPath": f"{field_path}{{{container}}}", "kind": "Pod",
                           "name": meta["name"], "namespace": meta["namespace"],
                           "resourceVersion": meta["resourceVersion"], "uid": meta["uid"]},
        "message": message,
        # The kubelet's recorder names an event `<object name>.<16 hex digits>`.
        "metadata": {"creationTimestamp": rfc3339(ts), "name": f"{meta['name']}.{digest[:16]}",
                     "namespace": meta["namespace"], "resourceVersion": str(resource_version),
                     "uid": f"{digest[16:24]}-{digest[24:28]}-4{digest[29:32]}-8{digest[33:36]}-{digest[36:48]}"},
        "reason": reason,
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "source": {"component": "kubelet", "host": node},
        "type": "Normal",
    }
