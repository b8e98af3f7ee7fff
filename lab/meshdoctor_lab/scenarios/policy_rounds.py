"""The drivers where an Istio policy in the sidecar is the story: overflow (a connectionPool's limits reached),
outlier (the only endpoint ejected), no-route (a VirtualService without a route for the path), mtls-strict (a
plaintext caller at a STRICT port) and tls-to-plaintext (the sidecar originating mTLS to a plaintext app).

Where the round's timing depends on what Envoy has seen (a request queued, an endpoint ejected) it asks Envoy's
admin API, with a deadline, instead of sleeping; a condition that never held is noted in the round's errors. That
Envoy is the one holding the DestinationRule's cluster: the pod's own (its stand-in for the callers' cluster), or,
through a caller sidecar (``pod.caller``), the caller's, in the client's namespace.

Every request names the service as a client would (``Host: POD_IP:PORT``, what http.client sends): a caller
sidecar routes it by the service's virtual host, not its ``allow_any`` passthrough."""

from __future__ import annotations

import http.client
import socket
import ssl
from pathlib import Path

from meshdoctor_lab.apps import HTTP_PORT
from meshdoctor_lab.state import LabPod

from .pod_admin import host_flags, stat_sum, wait_until
from .caller_rounds import response_of
from .http_rounds import http_get
from .rounds import IO_TIMEOUT, one_line, Tally
from .table import OUTLIER_AFTER, OUTLIER_CONSECUTIVE_5XX, OUTLIER_RECOVERY_WITHIN, OVERFLOW_SLOW

_SEEN_WITHIN = 5.0  # seconds Envoy gets to show that it has seen a request or an error
_HCM_ACTIVE = rf"^http\.inbound_0\.0\.0\.0_{HTTP_PORT};?\.downstream_rq_active$"
_UPSTREAM_ACTIVE = rf"^cluster\.inbound\|{HTTP_PORT}\|\|;?\.upstream_rq_active$"
# the caller sidecar's outbound cluster of the pod's port: a request sent, a request queued for a connection
_CALLER_ACTIVE = rf"^cluster\.outbound\|{HTTP_PORT}\|\|.*\.upstream_rq_active$"
_CALLER_PENDING = rf"^cluster\.outbound\|{HTTP_PORT}\|\|.*\.upstream_rq_pending_active$"
_DETECTED_5XX = r"^cluster\.outbound\|.*\.outlier_detection\.ejections_detected_consecutive_5xx$"
_OUTBOUND = f"outbound|{HTTP_PORT}||"


def _request(pod: LabPod, tally: Tally, path: str, label: str = "") -> int | None:
    """GET ``path`` on a new connection and record (label or path, status, body unless 200); a failed exchange is
    an error of the round, an answered one is not (its status is what the round is about)."""
    conn = http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=IO_TIMEOUT)
    try:
        conn.request("GET", path, headers={"User-Agent": "meshdoctor-lab"})
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        tally.errors.append(f"GET {path}: {one_line(exc)}")
        return None
    finally:
        conn.close()
    tally.http.append((label or path, response.status, "" if response.status == 200 else body.decode("latin-1")))
    tally.http_ok += response.status == 200
    return response.status


def _hold(pod: LabPod, path: str) -> socket.socket:
    """A connection with ``GET path`` written on it; its response is read later (_collect)."""
    sock = socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {pod.pod_ip}:{HTTP_PORT}\r\nUser-Agent: meshdoctor-lab\r\n\r\n"
                 .encode())
    return sock


def _cluster_netns(pod: LabPod) -> str:
    """The namespace of the Envoy that holds the DestinationRule's cluster (module docstring)."""
    return pod.client_netns if pod.caller == "sidecar" else pod.netns


def _collect(sock: socket.socket, tally: Tally, label: str) -> None:
    try:
        with sock:
            head = response_of(sock)
    except OSError as exc:
        tally.errors.append(f"{label}: {one_line(exc)}")
        return
    parts = head.split(b" ", 2)
    status = int(parts[1]) if head.startswith(b"HTTP/") and len(parts) > 1 and parts[1].isdigit() else 0
    tally.http.append((label, status, "" if status == 200 else head.split(b"\r\n", 1)[0].decode("latin-1")))
    tally.http_ok += status == 200


def overflow_round(pod: LabPod, tally: Tally) -> None:
    slow = f"/slow/{OVERFLOW_SLOW}"
    held: list[tuple[socket.socket, str]] = []
    try:
        # Through a caller sidecar the caller's cluster holds the pool: the second request queues there.
        sent, queued = ((_CALLER_ACTIVE, _CALLER_PENDING) if pod.caller == "sidecar" else
                        (_UPSTREAM_ACTIVE, _HCM_ACTIVE))
        netns = _cluster_netns(pod)
        held.append((_hold(pod, slow), f"{slow} (holds the connection)"))
        # The first request has gone upstream before the next is sent: it holds the only connection.
        if not wait_until(_SEEN_WITHIN, lambda: stat_sum(netns, sent) >= 1):
            tally.errors.append("the sidecar did not send the first request upstream")
        held.append((_hold(pod, slow), f"{slow} (queued for the connection)"))
        if not wait_until(_SEEN_WITHIN, lambda: stat_sum(netns, queued) >= (1 if pod.caller == "sidecar" else 2)):
            tally.errors.append("the sidecar did not take the second request")
        _request(pod, tally, "/overflow")  # the pending queue is full: the circuit breaker answers
    except OSError as exc:
        tally.errors.append(f"{slow}: {one_line(exc)}")
    finally:
        for sock, label in held:
            _collect(sock, tally, label)


def outlier_round(pod: LabPod, tally: Tally) -> None:
    # A former round's ejection (longer each time) ends first, so that the burst reaches the app.
    netns = _cluster_netns(pod)
    if not wait_until(OUTLIER_RECOVERY_WITHIN, lambda: host_flags(netns, _OUTBOUND) == ["healthy"]):
        tally.errors.append(f"the endpoint was not healthy within {OUTLIER_RECOVERY_WITHIN} s")
        return
    detected = stat_sum(netns, _DETECTED_5XX)
    for i in range(OUTLIER_CONSECUTIVE_5XX):
        _request(pod, tally, "/status/500", f"/status/500 ({i + 1} of the burst)")
    # Envoy's main thread counts the detection as it ejects the endpoint (or, above maxEjectionPercent, does not)
    if not wait_until(_SEEN_WITHIN, lambda: stat_sum(netns, _DETECTED_5XX) > detected):
        tally.errors.append(f"the sidecar detected no {OUTLIER_CONSECUTIVE_5XX} consecutive 5xx")
    for i in range(OUTLIER_AFTER):
        _request(pod, tally, f"/after-burst/{i}")


def no_route_round(pod: LabPod, tally: Tally) -> None:
    http_get(pod, tally, "/v1/ok")  # within the VirtualService's match
    http_get(pod, tally, "/other")  # outside every match: no route


def mtls_strict_round(pod: LabPod, tally: Tally) -> None:
    http_get(pod, tally, "/plaintext")  # the caller without a sidecar (or a caller sidecar told tls DISABLE)
    if pod.certs and pod.caller != "sidecar":  # through a caller sidecar every connection is the sidecar's
        _mtls_get(pod, tally, "/mtls")  # a caller with a sidecar: mTLS with Istio's ALPN


def _mtls_get(pod: LabPod, tally: Tally, path: str) -> None:
    """GET over mTLS as a caller's sidecar sends it: its workload certificate, the SNI of its ISTIO_MUTUAL cluster
    (``outbound_.PORT_._.HOST``, as the lab wrote it), ALPN istio-http/1.1; the server's certificate checked
    against the lab CA (its identity is a URI SAN, so no host name check)."""
    certs = Path(pod.certs)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(certs / "root-cert.pem")
    context.load_cert_chain(certs / "caller.pem", certs / "caller-key.pem")
    context.set_alpn_protocols(["istio-http/1.1"])
    label = f"{path} (mTLS)"
    try:
        server_name = (certs / "server-name").read_text().strip()
        with socket.create_connection((pod.pod_ip, HTTP_PORT), timeout=IO_TIMEOUT) as raw, \
                context.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {pod.pod_ip}:{HTTP_PORT}\r\nUser-Agent: meshdoctor-lab\r\n\r\n"
                        .encode())
            head = response_of(tls)
    except (OSError, ssl.SSLError) as exc:
        tally.errors.append(f"{label}: {one_line(exc)}")
        return
    parts = head.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    tally.http.append((label, status, "" if status == 200 else head.split(b"\r\n", 1)[0].decode("latin-1")))
    if status == 200:
        tally.http_ok += 1
    else:
        tally.errors.append(f"{label} answered HTTP {status}")


def tls_origination_round(pod: LabPod, tally: Tally) -> None:
    http_get(pod, tally, "/tls-origination")  # the sidecar's ClientHello meets the app's plaintext
