"""Logs as they reach a ticket: quoted in an e-mail, in a Markdown code block or bullet list, in inline code,
copied out of k9s, labelled by docker compose, saved by Windows (a BOM, UTF-16), pretty-printed by jq. The real
lines of the lab's stale-keepalive round (Envoy 1.40) are pasted each way, and each paste names the class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.wrappers import unwrap

from ..helpers import analyze_json

LOG = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40" / "stale-keepalive" / "istio-proxy.log"
LINES = LOG.read_text().splitlines()

PASTES = {
    "e-mail quote": lambda ln: "> " + ln,
    "nested quote": lambda ln: "> > " + ln,
    "markdown code block": lambda ln: "    " + ln,
    "bullet list": lambda ln: "- " + ln,
    "indented bullet": lambda ln: "  * " + ln,
    "inline code": lambda ln: f"`{ln}`" if ln.strip() else ln,
    "k9s": lambda ln: f"│ {ln:<200} │",
    "docker compose": lambda ln: "istio-proxy-1  | " + ln,
    "container label": lambda ln: "istio-proxy " + ln,
}


analyze = analyze_json


@pytest.mark.parametrize("paste", sorted(PASTES))
def test_a_pasted_log_names_the_class(paste, tmp_path):
    path = tmp_path / "ticket.txt"
    path.write_text("\n".join(PASTES[paste](ln) for ln in LINES) + "\n")
    code, report = analyze(path)
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 1 and {f["detector"] for f in found} == {"stale-keepalive"}, paste
    assert all(f["stands_on"] == ["access-log", "envoy-log"] for f in found), paste  # both logs read through it


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le-bom"])
def test_a_log_saved_on_windows_is_read(encoding, tmp_path):
    path = tmp_path / "proxy.log"
    text = "\r\n".join(LINES) + "\r\n"
    data = ("\ufeff" + text).encode("utf-16-le") if encoding == "utf-16-le-bom" else text.encode(encoding)
    path.write_bytes(data)
    code, report = analyze(path)
    assert code == 1 and {f["detector"] for f in report["findings"]} == {"stale-keepalive"}
    assert report["envoy"]["access_log_lines"] == sum(1 for ln in LINES if ln.startswith("[20"))


def test_json_lines_jq_printed_over_several_lines_are_read(tmp_path):
    """`kubectl logs ... | jq .` prints each JSON access-log line over many lines."""
    from tests.plugins.test_access_log_classes import CLASSES, as_json

    entry = json.loads(as_json(CLASSES["upstream-timeout"][0]))
    path = tmp_path / "jq.txt"
    path.write_text(json.dumps(entry, indent=2) + "\n" + json.dumps(entry, indent=4) + "\n")
    code, report = analyze(path)
    assert code == 1 and [f["detector"] for f in report["findings"]] == ["upstream-timeout"] * 2


@pytest.mark.parametrize("line", [
    LINES[0], next(ln for ln in LINES if ln.startswith("2026-")), "\tthread=2920", "':status', '503'",
    '{"start_time":"2026-12-03T14:01:38.768Z","response_code":503}', "- - -", "> not a log line",
    "    plain prose, indented", "* a bullet of prose",
])
def test_pasting_wrappers_never_eat_a_line_that_is_not_theirs(line):
    """A wrapper of pasting comes off only before the start of a line Envoy writes: Envoy's own lines, their
    continuation lines and plain prose are left as they are."""
    u = unwrap(line)
    assert u.text == line.rstrip("\r\n")


def test_several_sidecars_in_one_prefixed_log_keep_their_own_connections(tmp_path):
    """`kubectl logs -l app=x -c istio-proxy --prefix`: two sidecars' lines interleaved, their Envoys' connection
    ids the same numbers (each counts its own). Each pod's requests are told from its own lines."""
    from itertools import zip_longest

    data = LOG.parent.parent
    a = [f"[pod/orders-7d9/istio-proxy] {ln}" for ln in (data / "stale-keepalive" / "istio-proxy.log").read_text()
         .splitlines()]
    b = [f"[pod/payments-5c4/istio-proxy] {ln}" for ln in (data / "refused" / "istio-proxy.log").read_text()
         .splitlines()] + [f"[pod/reviews-6f1/istio-proxy] {ln}" for ln in (data / "healthy-http" / "istio-proxy.log")
                           .read_text().splitlines()]
    path = tmp_path / "prefixed.log"
    path.write_text("\n".join(x for pair in zip_longest(a, b) for x in pair if x is not None) + "\n")
    code, report = analyze(path)
    by = {(f["detector"], f.get("pod")) for f in report["findings"] if f["severity"] == "error"}
    assert code == 1 and by == {("stale-keepalive", "orders-7d9"), ("upstream-refused", "payments-5c4")}, by
    stale = [f for f in report["findings"] if f["detector"] == "stale-keepalive"]
    # its pool's reuse and idle spell, not the other Envoys' streams on connections of the same numbers
    assert stale and all(f["details"]["proven"] and f["details"]["idle_before_reuse_s"] > 1.0 for f in stale)
    assert all(f["stands_on"] == ["access-log", "envoy-log"] for f in report["findings"] if f["severity"] == "error")
