"""The pods a ``kubectl logs --prefix`` file names: ``kubectl logs -l app=x -c istio-proxy --prefix`` writes every
pod's lines into one file, each line starting ``[pod/NAME/CONTAINER] `` (kubernetes/kubernetes
staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go, addPrefixIfNeeded; envoy/wrappers.py takes it off). analyze
reads each named pod's lines with that pod's other files (sources/pod_inputs.py); which line is whose is decided
when the line is read (sources/envoy_files.py, by its unwrapped ``pod``), this only finds the names."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from kubectl_meshdoctor.pcap_header import is_capture
from kubectl_meshdoctor.sources.envoy_files import open_text

# Anywhere in a line's head: grep -H/-n or a timestamp wrapper may come before kubectl's prefix.
_PREFIX = re.compile(r"\[pod/([^/\]\s]+)/[^/\]\s]*\] ")
_HEAD_CHARS = 400  # no wrapper around kubectl's prefix is longer
_SNIFF = 1 << 16  # a --prefix file's first line has the prefix: a file without one in this head is not read whole


@dataclass(frozen=True, slots=True)
class PrefixPods:
    """What a file's lines name: ``pods`` named by a kubectl prefix, in the order first seen, and whether any
    non-blank line names none (``others``)."""

    pods: tuple[str, ...]
    others: bool


def prefix_pods(path: str) -> PrefixPods:
    """The pods kubectl's ``--prefix`` names in text file ``path`` (gzip too); none for a capture, a file
    without the prefix near its start, or one that cannot be read (analyze names that when it reads it).
    Reads the whole file once when its head has the prefix. Never raises."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF)
        if is_capture(head) or (head[:2] != b"\x1f\x8b" and b"[pod/" not in head):
            return PrefixPods((), True)
        pods: dict[str, None] = {}
        others = False
        with open_text(path) as fh:
            for line in fh:
                m = _PREFIX.search(line, 0, _HEAD_CHARS)
                if m is not None:
                    pods.setdefault(m.group(1))
                elif line.strip():
                    others = True
        return PrefixPods(tuple(pods), others)
    except (OSError, EOFError, ValueError, zlib.error):  # analyze names the file when it reads it
        return PrefixPods((), True)
