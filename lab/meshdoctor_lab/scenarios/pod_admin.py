"""A lab pod's Envoy admin API (127.0.0.1:15000 in the pod's network namespace), for the drivers that wait on
what Envoy has seen and for the evidence recorder. Needs root (setns)."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable
from urllib.parse import quote

from .podns import PodNetns

ADMIN = ("127.0.0.1", 15000)
_TIMEOUT_S = 5.0


def admin(pod_netns: str, path: str, method: str = "GET", timeout: float = _TIMEOUT_S) -> str:
    """The body of ``method path`` on the pod's admin port. Raises OSError (or http.client.HTTPException) when
    the admin port does not answer, and OSError for a status other than 200."""
    entered = PodNetns(pod_netns)
    try:
        with entered:  # the socket keeps the pod's namespace once made
            sock = socket.create_connection(ADMIN, timeout=timeout)
    finally:
        entered.close()
    conn = http.client.HTTPConnection(*ADMIN, timeout=timeout)
    conn.sock = sock
    try:
        conn.request(method, path)
        response = conn.getresponse()
        body = response.read().decode("utf-8", "replace")
    finally:
        conn.close()
    if response.status != 200:
        raise OSError(f"admin {method} {path}: HTTP {response.status}")
    return body


def stat_sum(pod_netns: str, pattern: str) -> int:
    """The sum of the stats (counters and gauges) whose names match the regex ``pattern`` (Envoy's own /stats
    filter, RE2); 0 when none does."""
    total = 0
    for line in admin(pod_netns, f"/stats?filter={quote(pattern)}").splitlines():
        _, sep, value = line.rpartition(": ")
        if sep and value.strip().isdigit():
            total += int(value)
    return total


def host_flags(pod_netns: str, cluster_prefix: str) -> list[str]:
    """The ``health_flags`` of every host of the clusters whose names start with ``cluster_prefix`` in
    /clusters (``healthy``, ``/failed_outlier_check``, ...)."""
    return [line.rsplit("::", 1)[1] for line in admin(pod_netns, "/clusters").splitlines()
            if line.startswith(cluster_prefix) and "::health_flags::" in line]


def wait_until(timeout: float, ready: Callable[[], bool], poll_s: float = 0.02) -> bool:
    """Poll ``ready`` until true or ``timeout`` seconds pass; returns whether it became true (the round notes a
    condition that never held; it does not raise)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return True
        except (OSError, http.client.HTTPException):
            pass  # the admin port busy or not yet there: ask again until the deadline
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
