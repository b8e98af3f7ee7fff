"""The pods a log of several pods' lines names: ``kubectl logs -l app=x -c istio-proxy --prefix`` writes every
pod's lines into one file, each line starting ``[pod/NAME/CONTAINER] `` (kubernetes/kubernetes
staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go, addPrefixIfNeeded), and stern starts each with ``POD
CONTAINER `` (stern/stern cmd/cmd.go); envoy/wrappers.py takes either off and says the pod. analyze reads each
named pod's lines with that pod's other files (sources/pod_inputs.py); which line is whose is decided again when
the line is read (sources/envoy_files.py, by the same unwrapped ``pod``), this only finds the names."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from kubectl_meshdoctor.envoy.wrappers import unwrap
from kubectl_meshdoctor.pcap_header import is_capture
from kubectl_meshdoctor.sources.envoy_files import open_text

_SNIFF_LINES = 200  # kubectl's and stern's wrappers are on every line: a file without one in its head has none
_LINE_HEAD = 4096  # what of a line is unwrapped: the wrappers are at its start (a line may be a gzip bomb's GBs)


def _heads(fh) -> Iterator[str]:
    """The first _LINE_HEAD characters of each line of text file ``fh``, the rest of a longer line read in pieces
    of that size and dropped: never a whole line in memory."""
    while True:
        line = fh.readline(_LINE_HEAD)
        if not line:
            return
        rest = line
        while not rest.endswith("\n"):
            rest = fh.readline(_LINE_HEAD)
            if not rest:
                break
        yield line


@dataclass(frozen=True, slots=True)
class LogPods:
    """What a file's lines name: ``pods`` a wrapper (kubectl --prefix, stern) names, in the order first seen, and
    whether any non-blank line names none (``others``)."""

    pods: tuple[str, ...]
    others: bool


def log_pods(path: str) -> LogPods:
    """The pods the wrappers of text file ``path`` (gzip too) name; none for a capture, a file whose head names
    none, or one that cannot be read (analyze names that when it reads it). Reads the whole file once, a line
    at a time, when its head names a pod. Never raises."""
    try:
        with open(path, "rb") as fh:
            if is_capture(fh.read(64)):
                return LogPods((), True)
        with open_text(path) as fh:
            if not any(unwrap(line).pod for line in islice(_heads(fh), _SNIFF_LINES)):
                return LogPods((), True)
        pods: dict[str, None] = {}
        others = False
        with open_text(path) as fh:
            for line in _heads(fh):
                pod = unwrap(line).pod
                if pod:
                    pods.setdefault(pod)
                elif line.strip():
                    others = True
        return LogPods(tuple(pods), others)
    except (OSError, EOFError, ValueError, zlib.error):
        return LogPods((), True)
