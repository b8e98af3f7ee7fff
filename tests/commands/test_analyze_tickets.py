"""analyze on what people really pasted into public tickets about intermittent 503/502/504 in Istio and Envoy
(issue 28): access-log lines, Envoy's debug log, /stats and /clusters excerpts, each kept as pasted (fences,
backticks, kubectl/stern/grep/Docker wrappers, TABs turned into spaces). tests/data/tickets/SOURCES.md names
each file's thread and the cause it found. Each file must be read, and name the class its evidence shows (by
Envoy's semantics of its flags, details and log lines), or no error for a file that shows no failure.

Cases the tool still gets wrong are strict xfails with the reason: each is a detector question, described in
SOURCES.md, not a reading gap."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import analyze_json

TICKETS = Path(__file__).resolve().parent.parent / "data" / "tickets"

# The format envoyproxy/envoy#9242's reporter gave with the line (its access_log config).
FORMAT_9242 = ("[%START_TIME(%d/%m/%YT%H:%M:%S%z %s)%] method=%REQ(:METHOD)% authority=%REQ(:AUTHORITY)% "
               "txId=%RESP(TID)% request=%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% alpn=%PROTOCOL% "
               "response_flag=%RESPONSE_FLAGS% ssl_protocol=%DOWNSTREAM_TLS_VERSION% "
               "ssl_cipher=%DOWNSTREAM_TLS_CIPHER% status=%RESPONSE_CODE% status_details=%RESPONSE_CODE_DETAILS% "
               "request_size=%BYTES_RECEIVED% response_size=%BYTES_SENT% envoy_request_id=%REQ(X-REQUEST-ID)% "
               "user-agent=%REQ(USER-AGENT)% xFor=%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% "
               "x-envoy-upstream-service-time=%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% total_time_ms=%DURATION% "
               "upstream=%UPSTREAM_HOST%")

# file -> (the kind it holds, the error classes its evidence shows; empty: no failure in it)
EXPECTED: dict[str, tuple[str, frozenset[str]]] = {
    "appmesh-egress-stats.txt": ("stats", frozenset()),
    "istio-3295-stats.txt": ("stats", frozenset({"stale-keepalive"})),
    "istio-10537-clusters.txt": ("clusters", frozenset()),
    "istio-13309-clusters.txt": ("clusters", frozenset()),
    "istio-6085-clusters.txt": ("clusters", frozenset()),
    "istio-7665-clusters-grep.txt": ("clusters", frozenset()),
    "envoy-8639-grep-context.txt": ("envoy-log", frozenset({"stale-keepalive"})),
    "envoy-13068-stern-spaces.txt": ("envoy-log", frozenset({"upstream-timeout"})),
    "envoy-15698-nr.txt": ("envoy-log", frozenset({"tls-mismatch"})),
    "hzeng10-idle-uc.txt": ("envoy-log", frozenset({"stale-keepalive"})),
    "istio-45802-uc.txt": ("envoy-log", frozenset({"stale-keepalive"})),
    "istio-51267-uf-backticks.md": ("envoy-log", frozenset({"upstream-refused"})),
    "istio-18995-json-uo.txt": ("envoy-log", frozenset({"circuit-breaker-overflow"})),
    "istio-19056-json-uaex.txt": ("envoy-log", frozenset({"access-log"})),
    "istio-35378-200-upe.txt": ("envoy-log", frozenset({"http-framing"})),
    "istio-36711-upe-debug-spaces.txt": ("envoy-log", frozenset({"http-framing"})),
    "istio-57294-upe-dpe.txt": ("envoy-log", frozenset({"downstream-protocol-error", "http-framing"})),
    "istio-13848-docker-json.txt": ("envoy-log", frozenset()),
    "istio-19437-timestamps-debug.txt": ("envoy-log", frozenset()),
    "istio-29109-timestamps.txt": ("envoy-log", frozenset()),
    "istio-3295-trace-2018.txt": ("envoy-log", frozenset()),
    # A gateway passing on its upstream's 502 (outbound cluster, via_upstream): the next hop answered it (next-hop).
    "llmd-502-via-upstream.txt": ("envoy-log", frozenset({"next-hop"})),
    "proxywasm-372-stern-tab.txt": ("envoy-log", frozenset()),
    # UF,URX lines naming no reason that lasted Istio's 10 s connectTimeout (9994 to 10001 ms): a connect timeout
    "istio-17139-json-ufurx.txt": ("envoy-log", frozenset({"syn-timeout"})),
    "istio-56356-ufurx-10s.txt": ("envoy-log", frozenset({"syn-timeout"})),
    # 503 with no flag and no upstream host: the sidecar's own answer (Istio 1.0's Mixer), an access-log finding
    "istio-8692-istio10-503.txt": ("envoy-log", frozenset({"access-log"})),
}

# Still wrong, and why (SOURCES.md, "Found, not fixed").
XFAIL: dict[str, tuple[str, frozenset[str], str]] = {
    "appmesh-ingress-stats.txt": ("stats", frozenset({"stale-keepalive"}),
                                  "stale-keepalive's counter rule wants the cluster's upstream_cx_http*_total, "
                                  "which the grep-filtered excerpt lacks"),
    "istio-47037-ur-debug.txt": ("envoy-log", frozenset({"access-log"}),
                                 "an upstream HTTP/2 stream closed with error 2 then 'request reset': no story "
                                 "ends in a failure without the router's own reset line"),
    "istio-6085-docker-json-uf.txt": ("envoy-log", frozenset({"syn-timeout"}),
                                      "its request field lost the space before HTTP/1.1: not even read in part"),
    "envoy-3771-metadata-trace.txt": ("envoy-log", frozenset(),
                                      "a custom Envoy --log-format prefix ([METADATA]) before the default "
                                      "format's fields"),
}


def _check(name: str, kind: str, classes: frozenset[str], *args: str) -> None:
    code, report = analyze_json(TICKETS / name, *args)
    assert report["source"]["kinds"][str(TICKETS / name)] == kind
    assert not [p for p in report["problems"] if "not read" in p.get("what", "")], report["problems"]
    errors = {f["detector"] for f in report["findings"] if f["severity"] == "error"}
    assert errors == classes, (name, errors)
    assert code == (1 if classes else 0)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_pasted_ticket_is_read_and_names_its_class(name):
    kind, classes = EXPECTED[name]
    _check(name, kind, classes)


def test_a_line_of_the_mesh_own_format_names_its_class_with_log_format():
    _check("envoy-9242-custom-ut.txt", "envoy-log", frozenset({"upstream-timeout"}), "--log-format", FORMAT_9242)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=XFAIL[name][2]))
                                  for name in sorted(XFAIL)])
def test_what_the_tool_still_gets_wrong(name):
    kind, classes, _ = XFAIL[name]
    _check(name, kind, classes)


def test_every_snippet_has_an_expectation_and_a_source():
    files = {p.name for p in TICKETS.iterdir() if p.name != "SOURCES.md"}
    assert files == set(EXPECTED) | set(XFAIL) | {"envoy-9242-custom-ut.txt"}
    sources = (TICKETS / "SOURCES.md").read_text()
    assert all(f"`{name}`" in sources for name in files)
