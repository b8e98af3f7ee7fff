"""Entering a lab pod's network namespace from its client namespace, and reading the pod's packet counters."""

from __future__ import annotations

import ctypes
import os

_CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class PodNetns:
    """Enter the pod's network namespace for a moment (sockets keep the namespace they were made in)."""

    def __init__(self, name: str) -> None:
        self._pod = os.open(f"/run/netns/{name}", os.O_RDONLY)
        self._home = os.open("/proc/self/ns/net", os.O_RDONLY)

    def __enter__(self) -> "PodNetns":
        _setns(self._pod)
        return self

    def __exit__(self, *exc: object) -> None:
        _setns(self._home)

    def close(self) -> None:
        os.close(self._pod)
        os.close(self._home)


def pod_packets(fd: int) -> dict[str, int] | None:
    """lo and eth0 packet counters of the namespace `fd` (a /proc/self/net/dev opened inside it) was opened in."""
    try:
        text = os.pread(fd, 1 << 16, 0).decode()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        cols = rest.split()
        if name.strip() == "lo":
            out["lo"] = int(cols[9])
        elif name.strip() == "eth0":
            out["eth0_rx"], out["eth0_tx"] = int(cols[1]), int(cols[9])
    if len(out) != 3:
        return None
    out["total"] = out["lo"] + out["eth0_rx"] + out["eth0_tx"]
    return out
