"""bench/fuzz's non-capture seeds: the repository's real logs and admin dumps, each in one shape a user holds it.

Seeds (nothing here is invented; each is a file of the repository):
- ``log``: real Envoy 1.40 `istio-proxy` logs of the lab (tests/data/envoy-1.40/*/istio-proxy.log: access-log
  lines and the debug log together), the debug log alone (tests/envoy/data/component_log/*.log), Istio's TEXT
  access-log samples (tests/envoy/data/istio_access_log.txt) and the lab's access logs (tests/data/*-access.log).
- ``stats``: /stats bodies (tests/envoy/data/stats_sample*.txt).
- ``clusters``: /clusters bodies, text and JSON (tests/envoy/data/clusters*.txt, clusters.json).

Shapes of a log: as read; Envoy's own log re-rendered in each shape Envoy and Istio print it
(tests/envoy/component_shapes.py); the access-log lines in Istio's JSON encoding (its keys:
tests/envoy/data/istio_access_log.txt); each line in one wrapper people paste (tests/envoy/test_wrappers.py
builds each the way its tool does: kubectl logs --timestamps/--prefix, stern, CRI, Docker's json-file, grep -n).

Secrets are planted only where the product promises to hide them (kubectl_meshdoctor/core/redact.py,
tests/commands/test_redact_analyze.py): a credential query parameter in a request target, the credential keys of a JSON
access log (envoy/log_format.py SENSITIVE_HEADERS), and `'name', 'value'` header dumps of Envoy's debug log.
Each carries its own marker; a marker on stdout or stderr is a secret shown.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the shape renderers and wrapper builders live beside the tests that check them

KINDS = ("log", "stats", "clusters")
COMPONENT_SHAPES = ("envoy", "envoy-1.15", "istio", "istio-1.9", "istio-pasted", "istio-json", "istio-json-1.22",
                    "bare")
WRAPPERS = ("kubectl-timestamps", "kubectl-prefix", "kubectl-prefix-timestamps", "stern", "stern-colour", "cri",
            "docker-json", "grep-n")
LOG_SHAPES = ("as-read", *COMPONENT_SHAPES, "access-json", *WRAPPERS)
SECRET_KEYS = ("authorization", "cookie", "x-api-key", "proxy-authorization", "set-cookie")
_REQUEST = re.compile(r'"([A-Z]+) (/[^ "?]*)(\?[^ "]*)? (HTTP/[0-9.]+)"')


def seeds() -> dict[str, list[tuple[str, list[str]]]]:
    """{kind: [(seed name, its lines)]}, read from the repository."""
    data, envoy = ROOT / "tests" / "data", ROOT / "tests" / "envoy" / "data"
    logs = [(f"{p.parent.name}-istio-proxy.log", p.read_text().splitlines())
            for p in sorted((data / "envoy-1.40").glob("*/istio-proxy.log"))]
    logs += [(f"component-{p.name}", p.read_text().splitlines()) for p in sorted((envoy / "component_log").glob("*.log"))]
    logs.append(("istio_access_log.txt", [ln for ln in (envoy / "istio_access_log.txt").read_text().splitlines()
                                          if ln.strip() and not ln.startswith("#")]))
    logs += [(p.name, p.read_text().splitlines()) for p in sorted(data.glob("*-access.log"))]
    stats = [(p.name, p.read_text().splitlines()) for p in sorted(envoy.glob("stats_sample*.txt"))]
    clusters = [(p.name, p.read_text().splitlines()) for p in sorted(envoy.glob("clusters*.txt"))]
    clusters.append(("clusters.json", (envoy / "clusters.json").read_text().splitlines()))
    return {"log": logs, "stats": stats, "clusters": clusters}


def marker(case: int, i: int) -> str:
    """A string no input holds and no renderer changes (letters and digits only)."""
    return f"Zq{case:06d}Sk{i}Qz"


def plant(lines: list[str], case: int, rnd: random.Random) -> tuple[list[str], list[str]]:
    """``lines`` of a log with secrets planted where the product promises to hide them: (new lines, markers)."""
    out: list[str] = []
    markers: list[str] = []

    def new() -> str:
        markers.append(marker(case, len(markers)))
        return markers[-1]

    for line in lines:
        m = _REQUEST.search(line)
        if m and rnd.random() < 0.5:  # a token in the request target (OAuth, signed URLs)
            param = rnd.choice(("access_token", "token", "code", "api_key", "sig", "ACCESS_TOKEN"))
            query = (m.group(3) + "&" if m.group(3) else "?") + f"{param}={new()}"
            line = line[:m.start(3) if m.group(3) else m.end(2)] + query + line[m.end(3) if m.group(3) else m.end(2):]
        out.append(line)
        if line.startswith("':authority'"):  # a request's header dump in the debug log (HeaderMapImpl::dumpState)
            out += [f"'authorization', 'Bearer {new()}'", f"'cookie', 'sid={new()}'",
                    f"'proxy-authorization', 'Basic {new()}'", f"'x-api-key', '{new()}'"]
        elif line.startswith("':status'"):
            out.append(f"'set-cookie', 'id={new()}; Path=/'")
    return out, markers


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def access_json(line: str, case: int, rnd: random.Random, markers: list[str]) -> str:
    """An access-log TEXT line in Istio's JSON encoding, a mesh's credential keys added; others unchanged."""
    from kubectl_meshdoctor.envoy.access_log import parse_line

    e = parse_line(line)
    if e is None or line.lstrip().startswith("{"):
        return line
    doc = {"start_time": _iso(e.ts), "route_name": e.route_name, "method": e.method, "path": e.path,
           "protocol": e.protocol, "response_code": e.code, "response_flags": ",".join(e.flags) or None,
           "response_code_details": e.details, "connection_termination_details": e.termination_details,
           "bytes_received": e.bytes_received, "bytes_sent": e.bytes_sent, "duration": e.duration_ms,
           "upstream_service_time": e.upstream_service_time, "x_forwarded_for": e.x_forwarded_for,
           "user_agent": e.user_agent, "request_id": e.request_id, "authority": e.authority,
           "upstream_host": e.upstream_host, "upstream_cluster": e.upstream_cluster,
           "upstream_local_address": e.upstream_local, "downstream_local_address": e.downstream_local,
           "downstream_remote_address": e.downstream_remote, "requested_server_name": e.requested_server_name,
           "upstream_transport_failure_reason": e.upstream_failure}
    for key in rnd.sample(SECRET_KEYS, rnd.randint(1, len(SECRET_KEYS))):
        markers.append(marker(case, len(markers)))
        doc[key] = {"authorization": "Bearer ", "proxy-authorization": "Basic ", "cookie": "sid=",
                    "set-cookie": "id="}.get(key, "") + markers[-1]
    return json.dumps(doc)


def _wrap(line: str, wrapper: str) -> str:
    from tests.envoy import test_wrappers as w

    if wrapper == "kubectl-prefix-timestamps":
        return w.kubectl_prefix(w.kubectl_timestamps(line))
    if wrapper == "stern-colour":
        return w.stern(line, colour=True)
    return {"kubectl-timestamps": w.kubectl_timestamps, "kubectl-prefix": w.kubectl_prefix, "stern": w.stern,
            "cri": w.cri, "docker-json": w.docker_json, "grep-n": w.grep_n}[wrapper](line)


def shaped(kind: str, lines: list[str], shape: str, case: int, rnd: random.Random) -> tuple[list[str], list[str]]:
    """A seed's lines in ``shape`` with secrets planted (logs only): (lines, markers)."""
    if kind != "log":
        return lines, []
    lines, markers = plant(lines, case, rnd)
    if shape in COMPONENT_SHAPES:
        from tests.envoy.component_shapes import render_log

        return render_log(lines, shape, tags=rnd.random() < 0.7), markers
    if shape == "access-json":
        return [access_json(ln, case, rnd, markers) for ln in lines], markers
    if shape in WRAPPERS:
        return [_wrap(ln, shape) for ln in lines], markers
    return lines, markers


def pick(kind: str, rnd: random.Random) -> str:
    """A shape for a seed of ``kind``."""
    return rnd.choice(LOG_SHAPES) if kind == "log" else "as-read"
