"""A caller sidecar's proven 503 UC race is with the next pod (its sidecar's idle timeout), not with an app: the
idle-timeout fix it prints speaks of the upstream (real Envoy 1.40's caller log, tests/data/envoy-1.40-mesh/
downstream-idle/caller); the server pod's own race still speaks of its app."""

from __future__ import annotations

from pathlib import Path

from ..helpers import analyze_json

MESH = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40-mesh"


def _idle_fix(report: dict) -> dict:
    (f,) = [f for f in report["findings"] if f["detector"] == "stale-keepalive" and f["fixes"]]
    (fix,) = f["fixes"]
    assert fix["name"] == "idle-timeout"
    return fix


def test_the_callers_fix_is_against_the_upstream_not_an_app():
    _, report = analyze_json(MESH / "downstream-idle" / "caller" / "istio-proxy.log")
    fix = _idle_fix(report)
    text = " ".join(str(fix[k]) for k in ("title", "keeps", "costs", "text"))
    assert "the upstream" in text and "the app" not in text, text


def test_the_server_pods_fix_is_against_its_app():
    _, report = analyze_json(MESH / "stale-keepalive" / "server")
    text = " ".join(str(_idle_fix(report)[k]) for k in ("title", "keeps", "costs"))
    assert "to the app before the app does" in text and "the upstream" not in text, text
