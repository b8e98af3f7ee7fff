"""The HTTP drivers: GETs through the sidecar whose statuses (and Envoy's answers) the round records, for
healthy-http, framing, stale-keepalive, refused and refused-localhost."""

from __future__ import annotations

import http.client
import time

from meshdoctor_lab.apps import CHUNKED_BODY, FRAMING_VARIANTS, HTTP_PORT
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, one_line, Tally
from .table import STALE_REUSE_AFTER

HEALTHY_SHORT_CONNECTIONS = 20


def http_get(pod: LabPod, tally: Tally, path: str, conn: http.client.HTTPConnection | None = None,
         expect_body: bytes | None = None) -> int | None:
    """GET `path` (on `conn`, else on a new connection closed afterwards); record (path, status, body).

    Returns the status, or None when the exchange failed (noted in tally.errors). A non-200 is an error too.
    """
    own = conn is None
    conn = conn or http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=IO_TIMEOUT)
    try:
        conn.request("GET", path, headers={"User-Agent": "meshdoctor-lab"})
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        tally.errors.append(f"GET {path}: {one_line(exc)}")
        return None
    finally:
        if own:
            conn.close()
    tally.http.append((path, response.status, "" if response.status == 200 else body.decode("latin-1")))
    if response.status == 200:
        tally.http_ok += 1
        if expect_body is not None and body != expect_body:
            tally.errors.append(f"GET {path}: body {body[:40]!r} is not {expect_body[:40]!r}")
    else:
        tally.errors.append(f"GET {path} answered HTTP {response.status}")
    return response.status


def healthy_http_round(pod: LabPod, tally: Tally) -> None:
    conn = http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=IO_TIMEOUT)
    try:
        http_get(pod, tally, "/length", conn)  # Content-Length only
        http_get(pod, tally, "/chunked", conn, expect_body=CHUNKED_BODY)  # one valid Transfer-Encoding: chunked
    finally:
        conn.close()
    http_get(pod, tally, "/close")  # the app FINs after answering; nothing is sent on that connection again
    for i in range(HEALTHY_SHORT_CONNECTIONS):
        http_get(pod, tally, f"/short/{i}")


def framing_round(pod: LabPod, tally: Tally) -> None:
    for path in FRAMING_VARIANTS:
        http_get(pod, tally, path)


def refused_round(pod: LabPod, tally: Tally) -> None:
    http_get(pod, tally, "/refused")


def stale_keepalive_round(pod: LabPod, tally: Tally) -> None:
    if http_get(pod, tally, "/stale/1") != 200:
        return
    done = time.monotonic()
    # The app's idle timer fires STALE_IDLE_TIMEOUT after its response; Envoy still holds the connection idle in
    # its pool (no FIN has come), so a request now is written on it and lands in the app's unread window.
    time.sleep(STALE_REUSE_AFTER)  # the race's timing itself, not a wait for a condition
    tally.reused_after_s = round(time.monotonic() - done, 3)
    http_get(pod, tally, "/stale/2")  # a NEW downstream connection: the sidecar serves it from its pool
