"""The healthy mesh's round (healthy-strict, healthy-strict-h2, healthy-short): the traffic issue 31's healthy mesh
must stay quiet on, PERMISSIVE or STRICT, HTTP/1.1 or h2 between the sidecars, kept alive or not.

One round: KEEPALIVE_REQUESTS GETs on one client connection (http.client keeps it alive), then CLOSE_REQUESTS
GETs each on a connection of its own that asks ``Connection: close`` (RFC 9112 section 9.6: the server closes
after its response), then ECHO_CONNECTIONS exchanges on the TCP echo port. Every request names the service
(``Host: POD_IP:5000``, what http.client sends), so a caller sidecar routes it by the service's virtual host and
outbound cluster, in Istio mTLS. A pod whose sidecar speaks mTLS (it has certificates) called without a caller
sidecar is called as a caller's sidecar would: the lab's caller certificate, Istio's SNI and ALPN (caller_tls)."""

from __future__ import annotations

import http.client
import socket
import ssl
from pathlib import Path

from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
from meshdoctor_lab.state import LabPod

from .rounds import IO_TIMEOUT, echo_exchange, one_line, Tally

KEEPALIVE_REQUESTS = 5
CLOSE_REQUESTS = 5
ECHO_CONNECTIONS = 2
# What an Istio caller's mTLS connection offers: an HTTP/1.1 request's (istio/proxy's istio.alpn filter,
# pilot/pkg/xds/filters/filters.go mtlsHTTP11ALPN) and a TCP cluster's (pilot/pkg/networking/util/util.go
# ALPNInMeshWithMxc); mesh_tls.py has the same lists for the lab's Envoys.
HTTP11_ALPNS = ("istio-http/1.1", "istio", "http/1.1")
TCP_ALPNS = ("istio-peer-exchange", "istio")


def caller_tls(pod: LabPod, alpns: tuple[str, ...]) -> ssl.SSLContext:
    """A TLS client context as a caller's sidecar holds it: the lab's caller certificate (pod.certs), the server's
    certificate checked against the lab CA (its identity is a URI SAN, so no host name check), ``alpns``."""
    certs = Path(pod.certs)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(certs / "root-cert.pem")
    context.load_cert_chain(certs / "caller.pem", certs / "caller-key.pem")
    context.set_alpn_protocols(list(alpns))
    return context


def server_name(pod: LabPod, port: int = HTTP_PORT) -> str:
    """The SNI a caller's sidecar sends to ``port`` of the pod (its outbound cluster's, ``outbound_.PORT_._.HOST``,
    as the lab wrote it for the HTTP port)."""
    http_name = (Path(pod.certs) / "server-name").read_text().strip()
    return http_name.replace(f"outbound_.{HTTP_PORT}_.", f"outbound_.{port}_.", 1)


class MeshConnection(http.client.HTTPConnection):
    """http.client over Istio mTLS, as a caller's sidecar connects (caller_tls, server_name)."""

    def __init__(self, pod: LabPod) -> None:
        super().__init__(pod.pod_ip, HTTP_PORT, timeout=IO_TIMEOUT)
        self.tls = caller_tls(pod, HTTP11_ALPNS)
        self.sni = server_name(pod)

    def connect(self) -> None:
        super().connect()
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.sni)


def _direct_mtls(pod: LabPod) -> bool:
    """Whether the round itself speaks mTLS: the pod's sidecar does and no caller sidecar does it for the round."""
    return bool(pod.certs) and pod.caller != "sidecar"


def _connection(pod: LabPod) -> http.client.HTTPConnection:
    if _direct_mtls(pod):
        return MeshConnection(pod)
    return http.client.HTTPConnection(pod.pod_ip, HTTP_PORT, timeout=IO_TIMEOUT)


def _get(conn: http.client.HTTPConnection, tally: Tally, path: str, close: bool) -> None:
    headers = {"User-Agent": "meshdoctor-lab", **({"Connection": "close"} if close else {})}
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        tally.errors.append(f"GET {path}: {one_line(exc)}")
        return
    tally.http.append((path, response.status, "" if response.status == 200 else body.decode("latin-1")))
    if response.status != 200:
        tally.errors.append(f"GET {path} answered HTTP {response.status}")
        return
    tally.http_ok += 1
    if close and not response.will_close:  # the answer to `Connection: close` must close (RFC 9112 9.6)
        tally.errors.append(f"GET {path} asked Connection: close and the connection was kept")


def _echo(pod: LabPod, tally: Tally, i: int) -> None:
    try:
        with socket.create_connection((pod.pod_ip, ECHO_PORT), timeout=IO_TIMEOUT) as raw:
            sock = (caller_tls(pod, TCP_ALPNS).wrap_socket(raw, server_hostname=server_name(pod, ECHO_PORT))
                    if _direct_mtls(pod) else raw)
            with sock:
                if echo_exchange(sock, f"meshdoctor-echo {i}\n".encode()):
                    tally.echo_ok += 1
                else:
                    tally.errors.append(f"echo on :{ECHO_PORT} came back wrong")
    except (OSError, ssl.SSLError) as exc:
        tally.errors.append(f"echo :{ECHO_PORT}: {one_line(exc)}")


def healthy_mesh_round(pod: LabPod, tally: Tally) -> None:
    conn = _connection(pod)
    try:
        for i in range(KEEPALIVE_REQUESTS):
            _get(conn, tally, f"/keepalive/{i}", close=False)
    finally:
        conn.close()
    for i in range(CLOSE_REQUESTS):
        conn = _connection(pod)
        try:
            _get(conn, tally, f"/close-each/{i}", close=True)
        finally:
            conn.close()
    for i in range(ECHO_CONNECTIONS):
        _echo(pod, tally, i)
