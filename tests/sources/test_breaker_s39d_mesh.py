"""Breaker s39d: issue 31 on the real two-hop recordings (tests/data/envoy-1.40-mesh), read as a user would."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import analyze_json

MESH = Path(__file__).parent.parent / "data" / "envoy-1.40-mesh"


@pytest.mark.xfail(strict=True, reason="s39d: a caller's access-log finding names the flow from the client app's "
                   "socket (%DOWNSTREAM_REMOTE_ADDRESS%, before the REDIRECT) instead of the hop's own connection "
                   "(%UPSTREAM_LOCAL_ADDRESS% -> %UPSTREAM_HOST%)")
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
