"""Mid-run, the findings of a watch of two pods as the report will give them (core/live_join.py): the recordings of
real Envoy 1.40 at both hops (tests/data/envoy-1.40-mesh), replayed through each pod's real pipeline as a watch
feeds it, compared before the end with what the end then makes of the same run."""

from __future__ import annotations

import asyncio

import pytest

from kubectl_meshdoctor.core.hops import join_hops
from kubectl_meshdoctor.core.live_join import LiveJoin
from kubectl_meshdoctor.core.pipeline import Pipeline

from ..mesh_replay import replay

SCENARIOS = ("refused", "downstream-idle", "stale-keepalive", "slow-app", "framing", "mtls-strict", "goaway")


def run(scenario: str) -> tuple[list[Pipeline], list]:
    pipelines: list[Pipeline] = []
    handed: list = []

    def new(pod: str) -> Pipeline:
        pipelines.append(Pipeline.with_detectors(pod=pod, on_finding=handed.append))
        return pipelines[-1]

    asyncio.run(replay(scenario, new))
    return pipelines, handed


def shape(findings) -> list[tuple]:
    return sorted((f.detector, f.pod, tuple(sorted(f.access_log)), tuple(sorted(map(str, f.evidence))))
                  for f in findings)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_view_before_the_end_is_what_the_end_reports(scenario):
    pipelines, handed = run(scenario)
    view = LiveJoin(lambda: pipelines).view()
    assert view is not None and view.covers == len(handed)
    # the end, as commands/watch/live.py makes it: each pod finished, then both pods' hops joined
    finished, logged = [], []
    for p in pipelines:
        finished += p.finish()
        logged += p.logged
    report = [f for f in join_hops(sorted(finished, key=lambda f: f.ts), logged) if f.evidence
              and not all(e.kind == "counter" for e in f.evidence)]
    assert shape(view.findings) == shape(f for f in report if f.detector in {g.detector for g in handed})


def test_downstream_idle_is_one_finding_before_the_end_where_the_pipelines_handed_two():
    """Issue 31's trial: the caller's row and the server's row of one failure. Both pods' eth0 hold the same
    connection; only the caller's finding quotes the 503 UC, and only once that line is attached to it."""
    pipelines, handed = run("downstream-idle")
    assert sorted((f.detector, f.pod) for f in handed) == [("stale-keepalive", "caller"), ("stale-keepalive", "server")]
    assert not any(f.access_log for f in handed)
    (one,) = LiveJoin(lambda: pipelines).view().findings
    assert (one.detector, one.pod) == ("stale-keepalive", "caller")
    assert [line.split('"')[2].split()[:2] for line in one.access_log] == [["503", "UC"]]
    assert any(h.get("pod") == "server" for h in one.details["hops"])


def test_the_view_is_joined_again_only_when_something_changed_and_not_more_often_than_asked():
    pipelines, _ = run("refused")
    clock = [100.0]
    live = LiveJoin(lambda: pipelines, every_s=1.0, clock=lambda: clock[0])
    first = live.view()
    assert live.joins == 1 and live.view() is first  # nothing new: the same view, not joined again
    pipelines[0].add_findings([first.findings[0]])  # a finding concluded now
    clock[0] += 0.5
    assert live.view() is first and live.joins == 1  # within every_s: the one before (covers says what it lacks)
    clock[0] += 0.5
    again = live.view()
    assert live.joins == 2 and again.covers == first.covers + 1


def test_a_slow_join_waits_longer_for_the_next():
    pipelines, _ = run("refused")
    clock = [100.0]

    def slow_clock() -> float:
        clock[0] += 0.5  # each reading half a second on: the join itself takes 0.5 s
        return clock[0]

    live = LiveJoin(lambda: pipelines, every_s=1.0, clock=slow_clock)
    first = live.view()
    pipelines[0].add_findings([first.findings[0]])
    clock[0] += 1.0  # past every_s, not past 0.5 s / SHARE
    assert live.view() is first and live.joins == 1
    clock[0] += 2.0
    assert live.view() is not first and live.joins == 2
