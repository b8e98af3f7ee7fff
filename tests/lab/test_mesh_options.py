"""Mesh-wide lab settings through real Envoy: the JSON access-log encoding (meshConfig.accessLogEncoding) and
Istio < 1.10's inbound dialling of 127.0.0.1, under which an app bound to 127.0.0.1 only still works."""

from __future__ import annotations

import json

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line
from meshdoctor_lab import lab

from .watching import capturing
from .lab_names import lab_name

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def legacy_json_lab(tmp_path_factory):
    name = lab_name("j")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, ("refused", "refused-localhost"), drivers=False,
                   mesh=lab.MeshOptions(access_log_encoding="JSON", legacy_inbound=True))
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def _json_lines(state, pod: str) -> list[dict]:
    return [json.loads(line) for line in lab.access_log_path(state, pod).read_text().splitlines()
            if line.startswith("{")]


def test_an_app_on_localhost_answers_when_the_sidecar_dials_localhost(legacy_json_lab):
    """The app bound to 127.0.0.1 that Istio >= 1.10 cannot reach (refused-localhost) works on an older mesh."""
    result = lab.trigger_round(legacy_json_lab, "refused-localhost")
    assert result.statuses == (200,) and result.errors == (), result
    from ..waiting import wait_until

    (doc,) = wait_until("the JSON access-log line", 10, lambda: _json_lines(legacy_json_lab, "refused-localhost"))
    assert doc["response_code"] == 200 and doc["upstream_host"] == "127.0.0.1:5000"
    assert doc["upstream_cluster"] == "inbound|5000||"
    entry = parse_line(json.dumps(doc))
    assert entry is not None and entry.code == 200 and entry.upstream_host == "127.0.0.1:5000"


def test_watch_links_the_json_uf_lines_to_the_refused_connections(legacy_json_lab):
    with capturing(legacy_json_lab, "pod/refused") as run:
        result = lab.trigger_round(legacy_json_lab, "refused")
        report = run.stop()
    assert result.statuses == (503,)
    refused = [f for f in report["findings"] if f["detector"] == "upstream-refused"]
    assert refused, json.dumps(report["findings"])[:3000]
    (f,) = refused
    assert f["flow"]["server"] == "127.0.0.1:5000" and f["flow"]["client"].startswith("127.0.0.1:")
    (line,) = f["access_log"]
    doc = json.loads(line)  # the raw line Envoy wrote, in its JSON encoding
    assert doc["response_flags"] == "UF" and doc["upstream_host"] == "127.0.0.1:5000"
    assert f["counters"]["cluster.inbound|5000||.upstream_cx_connect_fail"] == 1
    assert [x for x in report["findings"] if x["detector"] == "access-log"] == []
