"""Which pod a ``watch --write-pcap DIR`` folder's captures are of, written by watch and read by analyze.

watch names its files ``POD-IFACE.pcap`` in DIR (one pod) or ``DIR/POD/`` (several), but ``analyze DIR`` names a
pod after its directory: ``--write-pcap s43-cap`` read back became ``pod/s43-cap`` instead of the pod watch
captured, and a ``kubectl logs --prefix`` file beside it, whose lines name the real pod, became a pod of its own.
So watch leaves one small JSON file, ``META_NAME``, in each directory it writes captures to::

    {"written_by": "kubectl-meshdoctor watch", "captures": {"stale-keepalive-lo.pcap":
        {"pod": "stale-keepalive", "namespace": "default", "iface": "lo"}, ...}}

and analyze names the directory's pod after it when the captures it lists that are still there name one pod.
A folder without it (ksniff, tcpdump, one the user made) is read as before: the pod is the directory's name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from kubectl_meshdoctor.live.capture_copy import open_copy, replaceable
from kubectl_meshdoctor.sources.files import CaptureArg, InputError
from kubectl_meshdoctor.sources.pod_inputs import PodInputs, pod_of_dir

META_NAME = "meshdoctor-captures.json"
WRITTEN_BY = "kubectl-meshdoctor watch"
MAX_META_BYTES = 1 << 20  # a folder of at most 100 pods' names: anything bigger is not ours


@dataclass(frozen=True, slots=True)
class CaptureMeta:
    """One capture file watch wrote: its name in the directory, the pod and namespace it is of, its interface."""

    file: str
    pod: str
    namespace: str
    iface: str


def read_meta(directory: str) -> dict[str, CaptureMeta] | None:
    """The captures ``directory``'s META_NAME lists (file name -> CaptureMeta), or None when it has none, or one
    that is not watch's (not JSON, another shape, bigger than MAX_META_BYTES, a link or no regular file): then
    the directory is read as any folder is."""
    path = os.path.join(directory, META_NAME)
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > MAX_META_BYTES:
            return None
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != WRITTEN_BY or not isinstance(data.get("captures"), dict):
        return None
    out: dict[str, CaptureMeta] = {}
    for name, c in data["captures"].items():
        if isinstance(c, dict) and all(isinstance(c.get(k), str) and c.get(k) for k in ("pod", "namespace", "iface")):
            out[name] = CaptureMeta(name, c["pod"], c["namespace"], c["iface"])
    return out


def write_meta(directory: Path, captures: list[CaptureMeta], replace_file: bool = True) -> None:
    """Add ``captures`` to ``directory``'s META_NAME (made 0700 if absent), keeping what an earlier watch wrote
    there for other files. Owner-only, never through a link nor into another user's file
    (live/capture_copy.py open_copy). Raises OSError."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / META_NAME
    replaceable(str(path))  # a link, a FIFO or another user's file there: refused before it is read
    known = read_meta(str(directory)) or {}
    known.update({c.file: c for c in captures})
    body = {"written_by": WRITTEN_BY,
            "captures": {c.file: {"pod": c.pod, "namespace": c.namespace, "iface": c.iface}
                         for c in sorted(known.values(), key=lambda c: c.file)}}
    with open_copy(str(path), replace=replace_file) as fh:
        fh.write((json.dumps(body, indent=1) + "\n").encode())


def _dir_pod(directory: str) -> str | None:
    """The one pod the captures META_NAME lists and that are still in ``directory`` are of, else None."""
    meta = read_meta(directory)
    if not meta:
        return None
    pods = {c.pod for c in meta.values() if os.path.isfile(os.path.join(directory, c.file))}
    return pods.pop() if len(pods) == 1 else None


def named_by_watch(inputs: PodInputs) -> PodInputs:
    """``inputs`` with each pod named after a directory that holds watch's META_NAME renamed to the pod watch
    captured, and the META_NAME files themselves left out (they are no evidence). A pod given by name elsewhere
    (``FILE:POD/``, a ``kubectl logs --prefix`` line) joins it; InputError (one line) when another directory is
    already named as that pod: two pods would be read as one."""
    renamed: dict[str, str] = {}  # directory's pod name -> watch's
    dirs: dict[str, str] = {}  # directory -> its pod name, for the directories that named a pod
    for a in inputs.files:
        directory = os.path.dirname(os.path.abspath(a.path))
        if a.pod is not None and a.pod == pod_of_dir(directory) and a.line_pod is None:
            dirs.setdefault(directory, a.pod)
    for directory, pod in dirs.items():
        watched = _dir_pod(directory)
        if watched is None or watched == pod:
            continue
        clash = [d for d, p in dirs.items() if p == watched and d != directory]
        if clash:
            raise InputError(f"{directory} holds watch's captures of pod {watched}, and {clash[0]} is named so: "
                             f"give one's files as FILE:POD/ arguments with a pod name of its own")
        renamed[pod] = watched
    files: list[CaptureArg] = []
    for a in inputs.files:
        if os.path.basename(a.path) == META_NAME and read_meta(os.path.dirname(os.path.abspath(a.path))) is not None:
            continue
        files.append(replace(a, pod=renamed[a.pod]) if a.pod in renamed and a.line_pod is None else a)
    if not files:
        raise InputError("; ".join(p.line() for p in inputs.skipped) or f"nothing to read but {META_NAME}")
    return PodInputs(tuple(dict.fromkeys(files)), inputs.skipped)
