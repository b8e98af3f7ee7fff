"""HTTP to the sidecar's Envoy admin port (127.0.0.1:15000 in the pod) through the API server's port-forward.

The admin listener binds loopback only, so it is reachable only from inside the pod's network namespace; a
port-forward (pods/portforward) dials it there. Each port-forward websocket carries one TCP connection, so one
keep-alive HTTP/1.1 connection is kept per pod and re-opened when it breaks. The HTTP itself is the standard
library's client, speaking over the forwarded socket.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from kubernetes.stream import portforward

from .client import Kube, KubeError, api_error_message

ADMIN_PORT = 15000


@dataclass(frozen=True, slots=True)
class AdminResponse:
    status: int
    body: str


class _ForwardedConnection(http.client.HTTPConnection):
    """An HTTPConnection whose socket is a port-forwarded one instead of a TCP connect."""

    def __init__(self, open_socket, timeout: float) -> None:
        super().__init__("localhost", ADMIN_PORT, timeout=timeout)
        self._open_socket = open_socket

    def connect(self) -> None:
        self.sock = self._open_socket()
        self.sock.settimeout(self.timeout)


class EnvoyAdmin:
    """Envoy's admin API of one pod's sidecar. Thread-safe; every call blocks (run it in a worker thread).

    Raises KubeError with one line when the port-forward is refused (RBAC, pod gone) or nothing listens on the
    admin port.
    """

    def __init__(self, kube: Kube | None, namespace: str, pod: str, port: int = ADMIN_PORT, timeout_s: float = 10.0,
                 open_socket: Callable[[], socket.socket] | None = None):
        """``open_socket`` replaces the port-forward (e.g. a direct connection to a stand-in proxy in tests)."""
        self.kube, self.namespace, self.pod, self.port, self.timeout_s = kube, namespace, pod, port, timeout_s
        self._custom_socket = open_socket
        self._lock = threading.Lock()
        self._forward = None
        self._conn: _ForwardedConnection | None = None

    def get(self, path: str, params: dict[str, str] | str | None = None) -> AdminResponse:
        return self.request("GET", path, params)

    def post(self, path: str, params: dict[str, str] | str | None = None) -> AdminResponse:
        return self.request("POST", path, params)

    def request(self, method: str, path: str, params: dict[str, str] | str | None = None) -> AdminResponse:
        """One admin request; ``path`` like ``/clusters``, ``params`` the query as a dict or an encoded string
        (Envoy takes POST params in the query string). One retry on a fresh port-forward when the kept
        connection has gone stale."""
        query = params if isinstance(params, str) else urlencode(params or {})
        url = path + ("?" + query if query else "")
        with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                    conn.request(method, url, headers={"Host": "localhost", "Connection": "keep-alive"})
                    resp = conn.getresponse()
                    return AdminResponse(resp.status, resp.read().decode("utf-8", "replace"))
                except (OSError, http.client.HTTPException) as e:
                    error = self._forward_error() or str(e) or type(e).__name__
                    self._close_locked()
                    if attempt == 2:
                        raise KubeError(f"Envoy admin of pod/{self.pod} (port {self.port}): {error}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _connection(self) -> _ForwardedConnection:
        if self._conn is None:
            self._conn = _ForwardedConnection(self._open_socket, self.timeout_s)
        return self._conn

    def _open_socket(self):
        if self._custom_socket is not None:
            return self._custom_socket()
        try:
            self._forward = portforward(self.kube.streaming_core().connect_get_namespaced_pod_portforward, self.pod,
                                        self.namespace, ports=str(self.port))
        except Exception as e:  # the client raises ApiException(status=0) for handshake failures
            raise KubeError(f"cannot port-forward to pod/{self.pod}:{self.port}: {api_error_message(e)}") from None
        return self._forward.socket(self.port)

    def _forward_error(self) -> str | None:
        try:
            return self._forward.error(self.port) if self._forward is not None else None
        except Exception:
            return None

    def _close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._forward is not None:
            try:
                self._forward.close()
            except Exception:
                pass
            self._forward = None
