"""Envoy's debug log as stories of requests: the real lines of each failure class (Envoy 1.40 in the lab), in
every shape, tell the request's status, flags and the facts behind them (the pool's reuse of an idle connection,
the connect errno, the codec error), joined across the downstream and upstream connections."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.component_facts import fact_of
from kubectl_meshdoctor.envoy.component_log import read_component_log
from kubectl_meshdoctor.envoy.story import StoryBuilder, log_ref

from .component_shapes import SHAPES, render_log

DATA = Path(__file__).parent / "data" / "component_log"


def stories(lines: list[str]):
    builder, out = StoryBuilder("envoy.log"), []
    for n, entry in read_component_log(lines):
        fact = fact_of(entry)
        if fact is not None:
            out += builder.add(fact, log_ref("envoy.log", n, entry, fact.kind))
    return out + builder.finish()


# What each recorded class's failing requests are, as Envoy's access log says them (same file, same requests).
FAILING = {
    "stale-keepalive": {(503, ("UC",))},
    "refused": {(503, ("UF",))},
    "framing": {(502, ("UPE",))},
    "slow-app": {(504, ("UT",)), (0, ("DC",))},
    "goaway": {(503, ("UR",))},
    "port-exhaustion": {(503, ("UF",))},
    "http10": {(426, ("DPE",)), (400, ("DPE",)), (403, ())},
}


@pytest.mark.parametrize("shape", [*SHAPES, "as-recorded"])
@pytest.mark.parametrize("name", sorted(FAILING))
def test_each_class_reads_from_the_debug_log_in_every_shape(name, shape):
    lines = (DATA / f"{name}.log").read_text().splitlines()
    if shape != "as-recorded":
        lines = render_log(lines, shape, tags=shape not in ("envoy-1.15", "istio-1.9"))
    told = stories(lines)
    failing = [s for s in told if s.failed or s.details == "upgrade_failed"]
    assert {(s.status, s.flags) for s in failing if s.status is not None} == FAILING[name]
    for s in failing:
        assert s.refs and all(r.line >= 1 for r in s.refs)
    if name == "stale-keepalive":
        uc = [s for s in failing if s.flags == ("UC",)]
        # the pool gave the request a connection it held idle, and the app closed it under the request
        assert uc and all(s.upstream_reused and s.upstream_closed for s in uc)
        if shape != "bare":  # (the first one's previous request on that connection is before the excerpt)
            idle = [s.upstream_idle_s for s in uc if s.upstream_idle_s is not None]
            assert idle and all(i > 1.0 for i in idle)  # the app's Keep-Alive timeout is 1 s
            assert all(0.0 < s.upstream_closed_after_s < 0.5 for s in uc)
    if name == "refused":
        assert {s.errno for s in failing} == {111} and all(s.upstream_reused is False for s in failing)
    if name == "port-exhaustion":
        assert {s.errno for s in failing if s.status} == {99}
    if name == "framing":
        assert all("protocol error" in (s.codec_error or "") for s in failing if s.status)
    if name == "goaway":
        assert all(s.reset_reason == "remote refused stream reset" for s in failing)
    if shape != "bare":  # a request that reached the router has the id the access log joins on
        assert all(s.request_id for s in failing if s.upstream_connection is not None)


def test_healthy_requests_are_told_too_and_are_not_failures():
    told = stories((DATA / "downstream-idle.log").read_text().splitlines())
    assert told and not [s for s in told if s.failed]
    assert all(s.status == 200 and s.upstream_reused for s in told if s.path)


@pytest.mark.parametrize("message, detail, transport", [
    ("upstream reset", "", ""),  # Envoy's router with no reason after it (a cut line, or an older release)
    ("upstream reset: reset reason: connection termination", "connection termination", ""),
    ("upstream reset: reset reason: remote connection failure, transport failure reason: delayed connect error: "
     "111", "remote connection failure", "delayed connect error: 111"),
])
def test_an_upstream_reset_line_with_or_without_its_reason_is_one_fact(message, detail, transport):
    line = ('2026-12-03T14:01:46.279133Z\tdebug\tenvoy router source/common/router/router.cc:1697\t'
            f'[Tags: "ConnectionId":"2","StreamId":"16869936917595320856"] {message}')
    (n, entry), = read_component_log([line])
    fact = fact_of(entry)
    assert (fact.kind, fact.detail, fact.transport) == ("upstream-reset", detail, transport)
