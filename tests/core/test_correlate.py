"""Packet findings linked to the access-log lines they explain; unexplained failing lines reported alone."""

from pathlib import Path

from kubectl_meshdoctor.core.correlate import GRACE_S, Correlator, attach_counters
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.envoy.access_log import parse_line

UPE = ('[2025-06-12T08:14:09.644Z] "GET /orders/42 HTTP/1.1" 502 UPE upstream_reset_before_response_started'
       '{protocol_error} - "-" 0 87 3 - "-" "Go-http-client/1.1" "3b7caa0b-9626-946d-b4ef-36c5ddf790bc" '
       '"orders.shop.svc.cluster.local:5000" "10.244.1.23:5000" inbound|5000|| 127.0.0.6:44336 '
       '10.244.1.23:5000 10.244.2.7:44408 outbound_.5000_._.orders.shop.svc.cluster.local default')
UF = ('[2025-06-12T08:14:07.031Z] "GET /admin/health HTTP/1.1" 503 UF upstream_reset_before_response_started'
      '{remote_connection_failure|delayed_connect_error:_Connection_refused} - "delayed_connect_error:_Connection_'
      'refused" 0 167 0 - "-" "Go-http-client/1.1" "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90" '
      '"orders.shop.svc.cluster.local:5002" "10.244.1.23:5002" inbound|5002|| - 10.244.1.23:5002 '
      '10.244.2.7:51930 outbound_.5002_._.orders.shop.svc.cluster.local default')


def framing_finding(ts: float, server: str = "10.244.1.23:5000") -> Finding:
    return Finding("http-framing", Severity.ERROR, "bad framing", FlowRef("127.0.0.6:44336", server, "lo"),
                   (Evidence("p/lo", "lo", 7, ts, "response"),), ("UPE",), ts=ts)


def test_finding_gets_the_line_with_its_flag_host_and_time():
    c = Correlator("orders")
    upe, uf = parse_line(UPE), parse_line(UF)
    c.add(uf)
    c.add(upe)
    f = c.attach(framing_finding(upe.ts + 0.002))
    assert f.access_log == (UPE,)
    assert c.unexplained(None, [f])[0].access_log == (UF,)  # the UF line had no packet finding


def test_a_line_naming_another_upstream_connection_is_not_linked():
    """Envoy logs the upstream connection (%UPSTREAM_LOCAL_ADDRESS%); a finding on lo names its own, so two
    failures on two connections at the same time are not mixed up."""
    c = Correlator()
    upe = parse_line(UPE)  # upstream local address 127.0.0.6:44336
    c.add(upe)
    other = Finding("http-framing", Severity.ERROR, "bad framing", FlowRef("127.0.0.6:44337", "10.244.1.23:5000", "lo"),
                    (Evidence("p/lo", "lo", 9, upe.ts, "response"),), ("UPE",), ts=upe.ts)
    assert c.attach(other).access_log == ()
    assert c.attach(framing_finding(upe.ts)).access_log == (UPE,)


def test_on_eth0_the_line_of_another_caller_is_not_linked():
    c = Correlator()
    uf = parse_line(UF)  # downstream remote address 10.244.2.7:51930
    c.add(uf)

    def on_eth0(client: str) -> Finding:
        return Finding("syn-timeout", Severity.ERROR, "no answer", FlowRef(client, "10.244.1.23:5002", "eth0"),
                       (Evidence("p/eth0", "eth0", 3, uf.ts, "SYN"),), ("UF",), ts=uf.ts)

    assert c.attach(on_eth0("10.244.2.7:51931")).access_log == ()
    assert c.attach(on_eth0("10.244.2.7:51930")).access_log == (UF,)


def test_lines_far_in_time_or_for_another_host_are_not_linked():
    c = Correlator()
    upe = parse_line(UPE)
    c.add(upe)
    assert c.attach(framing_finding(upe.ts + 60)).access_log == ()
    assert c.attach(framing_finding(upe.ts, server="10.244.1.23:5999")).access_log == ()


def test_a_refused_connect_gets_only_the_request_whose_span_holds_it():
    """A UF line names no upstream connection (the connect failed), so time alone holds it to a refused connect
    on lo: a caller asking every 2 s, each refused, must not have its neighbours' lines on each finding."""
    c = Correlator()
    base = parse_line(UF)
    lines = [UF.replace("08:14:07.031Z", f"08:14:{7 + 2 * i:02d}.031Z").replace("0f6d1e52", f"0f6d1e5{i}")
             for i in range(3)]
    for line in lines:
        c.add(parse_line(line))

    def refused(ts: float) -> Finding:
        return Finding("upstream-refused", Severity.ERROR, "refused", FlowRef("127.0.0.6:40000", "10.244.1.23:5002",
                                                                              "lo"),
                       (Evidence("p/lo", "lo", 1, ts, "SYN"), Evidence("p/lo", "lo", 2, ts + 0.0001, "RST")),
                       ("UF",), ts=ts)

    assert [c.attach(refused(base.ts + 2 * i + 0.001)).access_log for i in range(3)] == [(line,) for line in lines]


def test_unexplained_line_waits_for_the_grace_period_then_names_flag_meaning_and_next_capture():
    c = Correlator("orders")
    uf = parse_line(UF)
    c.add(uf)
    assert c.unexplained(uf.ts + GRACE_S / 2, []) == []
    (f,) = c.unexplained(uf.ts + GRACE_S + 1, [])
    assert f.detector == "access-log" and f.severity is Severity.ERROR and f.envoy_flags == ("UF",)
    assert "UpstreamConnectionFailure" in f.explanation and "SYN from 127.0.0.6" in f.remediation
    assert f.flow.server == "10.244.1.23:5002" and f.access_log == (UF,)
    assert f.evidence[0].what.startswith("access log: 503 UF upstream_reset_before_response_started{remote_")
    assert f.evidence[0].what.endswith("|delayed_connect_error:_Connection_refused}")
    assert c.unexplained(None, []) == []  # reported once


def test_counters_that_back_the_finding_on_its_servers_inbound_cluster_are_attached():
    f = framing_finding(1.0)
    moved = {"inbound|5000||": {"upstream_cx_protocol_error": 2, "upstream_cx_total": 2},
             "inbound|5002||": {"upstream_cx_protocol_error": 1}}
    (g,) = attach_counters([f], moved, {"http-framing": ("upstream_cx_protocol_error",)})
    assert g.counters == {"cluster.inbound|5000||.upstream_cx_protocol_error": 2}
    (h,) = attach_counters([f], moved, {})  # a detector that declares none gets none
    assert h.counters == {}


def test_a_warning_of_no_failure_gets_no_failure_counters():
    """tuple-collision's exposure (the SYN succeeded: no flag) must not carry the collision's counters, nor the
    kernel's challenge ACKs, as though it had failed (issue 16); its collision still does."""
    from dataclasses import replace

    from kubectl_meshdoctor.core.correlate import attach_kernel_counters
    from kubectl_meshdoctor.core.detector import DetectorContext
    from kubectl_meshdoctor.core.flows import FlowTable
    from kubectl_meshdoctor_plugins.tuple_collision import TupleCollision

    backed = TupleCollision(DetectorContext(FlowTable())).backed_by_counters
    exposure = replace(framing_finding(1.0), detector="tuple-collision", severity=Severity.WARNING, envoy_flags=())
    failing = replace(exposure, envoy_flags=("UC",), severity=Severity.ERROR)
    moved = {"inbound|5000||": {"upstream_cx_destroy": 3}}
    kernel, backs = {"TcpExtTCPChallengeACK": 2}, {"tuple-collision": ("TcpExtTCPChallengeACK",)}
    g, h = attach_counters([exposure, failing], moved, {"tuple-collision": ("upstream_cx_destroy",)}, backed)
    k, e = attach_kernel_counters([exposure, failing], kernel, backs, backed)
    assert g.counters == {} and k.counters == {}
    assert h.counters == {"cluster.inbound|5000||.upstream_cx_destroy": 3}
    assert e.counters == {"kernel.TcpExtTCPChallengeACK": 2}

def test_an_access_log_finding_is_backed_by_the_counters_of_its_flag():
    c = Correlator("orders")
    uf = parse_line(UF)
    c.add(uf)
    (f,) = c.unexplained(None, [])
    moved = {"inbound|5002||": {"upstream_cx_connect_fail": 1, "upstream_cx_destroy_remote_with_active_rq": 3}}
    (g,) = attach_counters([f], moved, {})
    assert g.counters == {"cluster.inbound|5002||.upstream_cx_connect_fail": 1}


def test_a_story_joined_to_its_line_is_matched_by_the_line_not_by_the_story():
    """A debug-log story knows no upstream local address; its access-log line does. A packet finding on lo must
    take the story of its own connection's request, and not a neighbour's story with the neighbour's line."""
    from kubectl_meshdoctor.envoy.story import LogRef, StreamStory

    c = Correlator("orders")
    mine = parse_line(UPE)
    other = parse_line(UPE.replace("127.0.0.6:44336", "127.0.0.6:50000").replace("3b7caa0b", "aaaaaaaa"))
    for entry in (mine, other):
        c.add(entry, "proxy.log", 1)
        c.add_story(StreamStory("proxy.log", 7, 9, entry.ts, entry.ts + 0.003, request_id=entry.request_id,
                                status=502, details=entry.details, upstream_address=entry.upstream_host,
                                downstream_remote=entry.downstream_remote,
                                refs=(LogRef("proxy.log", 3, entry.ts, "upstream-reset", "[C7] upstream reset"),)))
    f = c.attach(framing_finding(mine.ts))
    assert f.access_log == (mine.raw,)
    assert len(f.envoy_log) == 1


def test_counters_on_the_cluster_the_line_names_back_its_finding():
    """A DestinationRule's outlier detection and TLS act on the caller's outbound cluster, and real Envoy 1.40
    counts their failures there (upstream_cx_none_healthy, ssl.connection_error on `outbound|5000||HOST`), not
    on the inbound cluster of the port: the line's %UPSTREAM_CLUSTER% says which."""
    from dataclasses import replace

    cluster = "outbound|5000||outlier.shop.svc.cluster.local"
    line = (f'[2026-12-03T14:47:10.675Z] "GET /after-burst/0 HTTP/1.1" 503 UH no_healthy_upstream - "-" 0 19 0 - '
            f'"-" "curl" "e3794df4-b888-4cbc-b7e9-7e1418c74544" "10.0.0.2:5000" "-" {cluster} - 10.0.0.2:5000 '
            f'10.0.0.1:33766 - default')
    assert parse_line(line).upstream_cluster == cluster
    f = replace(framing_finding(1.0), detector="no-healthy-upstream", access_log=(line,))
    moved = {cluster: {"upstream_cx_none_healthy": 2, "upstream_cx_total": 1},
             "inbound|5000||": {"upstream_cx_none_healthy": 0, "upstream_rq_503": 2},
             "outbound|5000||other.shop.svc.cluster.local": {"upstream_cx_none_healthy": 7}}
    (g,) = attach_counters([f], moved, {"no-healthy-upstream": ("upstream_cx_none_healthy",)})
    assert g.counters == {f"cluster.{cluster}.upstream_cx_none_healthy": 2}
    (h,) = attach_counters([replace(f, access_log=())], moved, {"no-healthy-upstream": ("upstream_cx_none_healthy",)})
    assert h.counters == {}  # no line names the outbound cluster: only the port's inbound one is looked at


def test_no_failure_is_lost_when_a_long_log_runs_past_the_window(tmp_path):
    """A log read with no packet to tick on decides its requests at the end; the window holds MAX_LINES, so the
    requests that leave it undecided are decided then: 50 failures before 15,000 good lines are 50 findings."""
    import asyncio
    import re

    from kubectl_meshdoctor.core.correlate import MAX_LINES
    from kubectl_meshdoctor.core.pipeline import Pipeline
    from kubectl_meshdoctor.sources.envoy_files import read_access_log

    async def gate() -> None:
        return None

    real = (Path(__file__).parent.parent / "data" / "envoy-1.40" / "stale-keepalive" / "istio-proxy.log").read_text()
    uc = next(ln for ln in real.splitlines() if '" 503 UC ' in ln)
    ok = next(ln for ln in real.splitlines() if '" 200 ' in ln)
    failures = [re.sub(r'"[0-9a-f]{8}-', f'"{i:08x}-', uc) for i in range(50)]
    log = tmp_path / "proxy.log"
    log.write_text("\n".join(failures + [ok] * (MAX_LINES + 5000)) + "\n")
    pipeline = Pipeline.with_detectors()
    asyncio.run(read_access_log(str(log), pipeline.context, gate))
    found = [f for f in pipeline.finish() if f.detector == "stale-keepalive"]
    assert sorted(line for f in found for line in f.access_log) == sorted(failures)


def test_a_failing_line_of_a_request_before_the_capture_began_is_context_not_an_error():
    """Issue 32, item 2: a watch opened with ERROR access-log ... without packet evidence for lines of requests
    that ran before its capture began (the log is followed first). Live, the pipeline learns the capture's start
    (CaptureStartEvent); a failing request that began earlier is counted as context, one that began later is
    judged as before."""
    from kubectl_meshdoctor.core.events import AccessLogEvent, CaptureStartEvent
    from kubectl_meshdoctor.core.pipeline import Pipeline

    uf = parse_line(UF)
    for start, errors, context in ((uf.ts + 0.5, 0, 1), (uf.ts - 0.5, 1, 0), (None, 1, 0)):
        p = Pipeline.with_detectors(pod="orders")
        if start is not None:
            p.context(CaptureStartEvent(start))
        p.context(AccessLogEvent(uf.ts, uf))
        found = [f for f in p.finish() if f.severity is Severity.ERROR]
        assert len(found) == errors and p.correlator.before_capture == context, (start, found)


def test_a_full_pipeline_drops_an_info_finding_for_a_failure_never_the_failure(monkeypatch):
    """An app answering thousands of 500s makes as many info findings (app-5xx); past MAX_FINDINGS a failure takes
    the oldest info finding's slot, so the failure is listed and the report still counts one dropped."""
    from kubectl_meshdoctor.core import pipeline as pipeline_module
    from kubectl_meshdoctor.core.pipeline import Pipeline

    monkeypatch.setattr(pipeline_module, "MAX_FINDINGS", 3)
    p = Pipeline.with_detectors(only=[], pod="orders")

    def one(severity: Severity, n: int) -> Finding:
        return Finding("app-5xx" if severity is Severity.INFO else "upstream-refused", severity, f"#{n}",
                       FlowRef("10.0.0.1:1", "10.0.0.2:5000", ""), (), ts=float(n))

    p.add_findings([one(Severity.INFO, n) for n in range(3)] + [one(Severity.ERROR, 3), one(Severity.ERROR, 4),
                                                                 one(Severity.INFO, 5)])
    assert sorted(f.title for f in p.findings) == ["#2", "#3", "#4"] and p.stats.findings_dropped == 3
