"""Breaker s39d: issue 31 on the real two-hop recordings (tests/data/envoy-1.40-mesh), read as a user would."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import analyze_json

MESH = Path(__file__).parent.parent / "data" / "envoy-1.40-mesh"


def test_a_callers_log_finding_names_its_hops_own_connection(tmp_path):
    """downstream-idle, the caller's access-log lines only (what `kubectl logs POD -c istio-proxy | grep` gives):
    the 503 UC is on the leg caller sidecar -> server sidecar, whose connection is the line's
    %UPSTREAM_LOCAL_ADDRESS% to %UPSTREAM_HOST% (Envoy docs, access_log/usage: UPSTREAM_LOCAL_ADDRESS is "local
    address of the upstream connection"); %DOWNSTREAM_REMOTE_ADDRESS% is the client app's socket in the caller
    pod, which went to 15001 over lo and never crossed eth0 (DESIGN.md: for a caller sidecar's own line only its
    %UPSTREAM_LOCAL_ADDRESS%)."""
    caller = tmp_path / "caller"
    caller.mkdir()
    lines = [line for line in (MESH / "downstream-idle" / "caller" / "istio-proxy.log").read_text().splitlines()
             if line.startswith("[20") and " 503 UC " in line]
    assert lines
    (caller / "istio-proxy.log").write_text("\n".join(lines) + "\n")
    fields = lines[0].split()
    upstream_local, upstream_host = fields[-5], fields[-7].strip('"')
    _, report = analyze_json(caller)
    [finding] = [f for f in report["findings"] if f.get("access_log") == lines]
    assert finding["hop"]["leg"] == "caller sidecar -> server sidecar"
    assert (finding["flow"]["client"], finding["flow"]["server"]) == (upstream_local, upstream_host), finding["flow"]


def _shifted(line: str, seconds: float) -> str:
    """The TEXT line with its %START_TIME% moved by ``seconds`` (a pod whose clock runs ahead)."""
    from datetime import datetime, timedelta

    stamp = line[1:line.index("]")]
    moved = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ") + timedelta(seconds=seconds)
    return f"[{moved.strftime('%Y-%m-%dT%H:%M:%S.')}{moved.microsecond // 1000:03d}Z]" + line[line.index("]") + 1:]


def test_a_shared_request_id_and_a_small_clock_skew_keep_each_request_with_its_own_line(tmp_path):
    """framing's five requests ride one caller->server connection (their %UPSTREAM_LOCAL_ADDRESS% is one), 2-5 ms
    apart. A client that sends one fixed x-request-id, and a server pod whose clock is 4 ms ahead: each finding
    must still quote the caller's and the server's line of the same request (one HTTP/1.1 connection carries its
    requests one after another, RFC 9112 section 9.3, so their order is the same in both logs)."""
    rid = "00000000-0000-0000-0000-000000000001"
    for pod, skew in (("caller", 0.0), ("server", 0.004)):
        (tmp_path / pod).mkdir()
        lines = [line for line in (MESH / "framing" / pod / "istio-proxy.log").read_text().splitlines()
                 if line.startswith("[20")]
        fixed = [_shifted(line.replace(line.split('"')[9], rid), skew) for line in lines]
        (tmp_path / pod / "istio-proxy.log").write_text("\n".join(fixed) + "\n")
    _, report = analyze_json(tmp_path / "caller", tmp_path / "server")
    paths = [[line.split('"')[1].split()[1] for line in f.get("access_log", ())] for f in report["findings"]]
    assert len(paths) == 5 and all(len(p) == 2 for p in paths), paths
    assert all(p[0] == p[1] for p in paths), paths


def _access_lines(scenario: str, pod: str) -> list[str]:
    return [line for line in (MESH / scenario / pod / "istio-proxy.log").read_text().splitlines()
            if line.startswith("[20")]


def test_both_pods_access_logs_link_a_callers_503_to_the_servers_tls_mismatch(tmp_path):
    """mtls-strict, the two pods' access-log lines only (`kubectl logs -c istio-proxy` of each): the server's
    sidecar logs the plaintext connection as `0 NR filter_chain_not_found` (no request, so no x-request-id), the
    caller's as `503 UC`. The line's four-tuple is one (DESIGN.md, hop pairing rule 1: ids equal *when both
    logged*), so the caller's 503 is the server's tls-mismatch, one finding quoting both lines."""
    for pod in ("caller", "server"):
        (tmp_path / pod).mkdir()
        (tmp_path / pod / "istio-proxy.log").write_text("\n".join(_access_lines("mtls-strict", pod)) + "\n")
    _, report = analyze_json(tmp_path / "caller", tmp_path / "server")
    got = [(f["detector"], f["pod"], len(f.get("access_log", ()))) for f in report["findings"]]
    assert got == [("tls-mismatch", "server", 2)], got


def test_a_tls_mismatch_seen_from_both_pods_is_one_finding(tmp_path):
    """mtls-strict: the caller's eth0.pcap and access log, the server's access log. The caller's capture shows
    the plaintext request answered by RST, the server's line the same four-tuple: one finding."""
    for pod in ("caller", "server"):
        (tmp_path / pod).mkdir()
        (tmp_path / pod / "istio-proxy.log").write_text("\n".join(_access_lines("mtls-strict", pod)) + "\n")
    (tmp_path / "caller" / "eth0.pcap").write_bytes((MESH / "mtls-strict" / "caller" / "eth0.pcap").read_bytes())
    _, report = analyze_json(tmp_path / "caller", tmp_path / "server")
    got = [(f["detector"], f["pod"]) for f in report["findings"] if f["severity"] == "error"]
    assert len(got) == 1 and got[0][0] == "tls-mismatch", got


def test_a_retried_requests_attempts_are_one_finding_each_line_quoted_once():
    """envoy-1.40-mesh-retry503/refused, both pods as recorded: the caller's sidecar (Istio < 1.24's retry of a
    503) logs one `503 URX via_upstream`, the server's sidecar one `503 UF` per attempt, and its lo capture one
    SYN/RST per attempt. DESIGN.md: the attempts of one retried request are one finding, each attempt's
    connection in details.attempts, and every line is quoted once."""
    case = MESH.parent / "envoy-1.40-mesh-retry503" / "refused"
    _, report = analyze_json(case / "caller", case / "server")
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    quoted = [line for f in report["findings"] for line in f.get("access_log", ())]
    assert len(quoted) == len(set(quoted)), [(f["detector"], len(f.get("access_log", ()))) for f in errors]
    assert len(errors) == 1 and len(errors[0]["details"].get("attempts", ())) == 3, errors[0]["details"]
