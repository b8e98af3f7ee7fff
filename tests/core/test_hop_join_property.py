"""No join loses a line (core/hops.py): whatever requests, chains, shared x-request-ids and connections the pods'
logs hold, every access-log line a finding quoted is quoted by exactly one finding after join_hops, and every
logged line it used by exactly one too; a chain failing at its far end is one finding, and the requests of one
connection that share an x-request-id keep their own lines whatever the two clocks' skew."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kubectl_meshdoctor.core.findings import Evidence, Finding, NoFlow, Severity
from kubectl_meshdoctor.core.hops import LoggedLine, join_hops
from kubectl_meshdoctor.envoy.access_log import parse_line

from .hop_lines import Pod, inbound, outbound

PODS = [Pod("gateway", "10.244.0.5", 8080, "gateway"), Pod("a", "10.244.1.23", 5000, "a"),
        Pod("b", "10.244.2.40", 8080, "b"), Pod("c", "10.244.3.41", 9090, "c")]
# what a sidecar logs of a request, (code, flag): a relay of the next hop's answer, its own failures, an app's 5xx
OUTBOUND = [(503, "-"), (504, "-"), (500, "-"), (504, "UT"), (503, "UF"), (0, "DC")]
INBOUND = [(503, "-"), (500, "-"), (504, "-"), (503, "UF"), (502, "UPE"), (0, "DC")]


@st.composite
def logs(draw) -> tuple[list[Finding], list[LoggedLine]]:
    lines: list[tuple[str, str]] = []  # (pod, line)
    for n in range(draw(st.integers(1, 4))):
        path = draw(st.permutations(PODS))[:draw(st.integers(2, 4))]
        rid = draw(st.sampled_from(["r1", "r2", None]))  # ids reused across requests, or none logged
        t = draw(st.sampled_from([0.0, 0.5, 3.0]))
        for hop, (src, dst) in enumerate(zip(path, path[1:])):
            port = draw(st.sampled_from([52000, 52001]))
            at = t + hop * 0.001
            both = draw(st.booleans())
            code, flag = draw(st.sampled_from(OUTBOUND))
            out = outbound(src, dst, code, flag, rid, at, port, with_local=both).replace("/orders", f"/o/{n}")
            code, flag = draw(st.sampled_from(INBOUND))
            inn = inbound(src, dst, code, flag, rid, at + 0.0005, port, with_remote=both).replace("/orders",
                                                                                                  f"/o/{n}")
            lines += [(src.name, out), (dst.name, inn)]
    findings: list[Finding] = []
    logged: list[LoggedLine] = []
    named = draw(st.booleans())  # analyze DIR per pod names them; plain files read together do not
    for k, (name, line) in enumerate(lines):
        pod = name if named else None
        entry = parse_line(line)
        fate = draw(st.sampled_from(["finding", "finding", "logged", "none", "with-previous"]))
        if fate == "with-previous" and findings and findings[-1].pod == pod:  # one finding of several requests
            findings[-1] = findings[-1].with_lines([(line, entry)])
        elif fate == "logged" and entry.code >= 500:
            logged.append(LoggedLine(pod, line, entry, Evidence.log_line(f"{name}.log", k, entry.ts, "line")))
        elif fate != "none":
            findings.append(Finding("x", Severity.ERROR, "t", NoFlow("counter", "c"), (), explanation="E.", pod=pod,
                                    ts=entry.ts, access_log=(line,), entries=(entry,)))
    return findings, logged


@settings(max_examples=300, deadline=None)
@given(logs())
def test_every_line_is_quoted_by_exactly_one_finding(case):
    findings, logged = case
    out = join_hops(findings, logged)
    quoted = Counter(line for f in out for line in f.access_log)
    for line in {line for f in findings for line in f.access_log}:
        assert quoted[line] == 1, line
    given_lines = {x.text for x in logged}
    assert all(quoted[x] == 1 for x in given_lines if x in quoted)
    assert set(quoted) <= {line for f in findings for line in f.access_log} | given_lines
    assert len(out) <= len(findings)


def _finding(pod: str, lines: list[str]) -> Finding:
    entries = tuple(parse_line(line) for line in lines)
    return Finding("x", Severity.ERROR, "t", NoFlow("counter", "c"), (), explanation="E.", pod=pod,
                   ts=entries[0].ts, access_log=tuple(lines), entries=entries)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 4), st.booleans())
def test_a_chain_failing_at_its_far_end_is_one_finding_in_path_order(length, middles_joined):
    """Every hop before the last passes the far end's 503 UF on (via_upstream, each middle pod's app answering its
    caller with it): one finding, the far end's, quoting every line from the first caller's on."""
    path = PODS[:length]
    chain: list[tuple[str, str]] = []
    for hop, (src, dst) in enumerate(zip(path, path[1:])):
        last = hop == length - 2
        chain += [(src.name, outbound(src, dst, 503, "-", "r1", hop * 0.002, 52000 + hop)),
                  (dst.name, inbound(src, dst, 503, "UF" if last else "-", "r1", hop * 0.002 + 0.001, 52000 + hop))]
    by_pod: dict[str, list[str]] = {}
    for pod, line in chain:
        by_pod.setdefault(pod, []).append(line)
    findings = ([_finding(pod, lines) for pod, lines in by_pod.items()] if middles_joined
                else [_finding(pod, [line]) for pod, line in chain])
    out = join_hops(findings)
    assert [(f.pod, f.access_log) for f in out] == [(path[-1].name, tuple(line for _, line in chain))]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(2, 5), min_size=1, max_size=6), st.integers(0, 5))
def test_one_connections_requests_of_one_id_pair_in_order_whatever_the_skew(gaps_ms, skew_ms):
    """Requests on one HTTP/1.1 connection, one fixed x-request-id and one path, 2-5 ms apart, the server's clock
    ``skew_ms`` ahead: each caller line stays with its own request's server line (told apart here by duration)."""
    src, dst = PODS[0], PODS[1]
    findings, at = [], 0.0
    for n, gap in enumerate([0, *gaps_ms]):
        at += gap / 1000
        findings += [_finding("gateway", [outbound(src, dst, 503, "-", "r1", at, 52000, duration_ms=10 + n)]),
                     _finding("a", [inbound(src, dst, 503, "UF", "r1", at + skew_ms / 1000, 52000,
                                            duration_ms=10 + n)])]
    out = join_hops(findings)
    assert len(out) == len(gaps_ms) + 1
    for f in out:
        assert len({e.duration_ms for e in f.entries}) == 1 and len(f.entries) == 2, f.access_log
