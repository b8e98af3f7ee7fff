"""A request across more than two pods, and x-request-ids shared by several requests (core/hops.py,
core/hop_pairs.py): the lines of each hop pair one-to-one, by the hop's four-tuple first, and the folds of a
chain end at one finding that quotes every hop's line in path order."""

from __future__ import annotations

from kubectl_meshdoctor.core.findings import Finding, NoFlow, Severity
from kubectl_meshdoctor.core.hops import join_hops

from ..helpers import analyze_json
from .hop_lines import Pod, inbound, outbound

GATEWAY = Pod("gateway", "10.244.0.5", 8080, "gateway")
A = Pod("a", "10.244.1.23", 5000, "a")
B = Pod("b", "10.244.2.40", 8080, "b")
B2 = Pod("b2", "10.244.3.41", 8080, "b")
RID = "7c3e1f0a-5b2d-9e8f-a1c4-3d6b9e0f2a71"


def test_a_three_pod_chain_is_one_finding_quoting_every_hop_in_order(tmp_path):
    """gateway -> a -> b, one x-request-id at every hop: b is slow, a's sidecar times its call out (504 UT), b's
    sidecar sees a go away (0 DC), a's app answers 504 and the gateway passes it on. One finding, a's, quotes the
    four lines gateway, a, a, b."""
    lines = {
        "gateway": [outbound(GATEWAY, A, 504, "-", RID, 0.0, 41000, duration_ms=1004)],
        "a": [inbound(GATEWAY, A, 504, "-", RID, 0.001, 41000, duration_ms=1003),
              outbound(A, B, 504, "UT", RID, 0.002, 52000, duration_ms=1001)],
        "b": [inbound(A, B, 0, "DC", RID, 0.003, 52000, duration_ms=1000)],
    }
    for pod, logged in lines.items():
        (tmp_path / pod).mkdir()
        (tmp_path / pod / "istio-proxy.log").write_text("\n".join(logged) + "\n")
    _, report = analyze_json(*(tmp_path / pod for pod in lines))
    chain = [lines["gateway"][0], *lines["a"], lines["b"][0]]
    quoting = [f for f in report["findings"] if set(f.get("access_log", ())) & set(chain)]
    assert [(f["detector"], f["pod"]) for f in quoting] == [("upstream-timeout", "a")], quoting
    assert quoting[0]["access_log"] == chain
    assert [(h["pod"], h["role"]) for h in quoting[0]["details"]["hops"]] == [
        ("gateway", "caller"), ("a", "server"), ("b", "server")]
    assert sorted(quoting[0]["hop"]["also"]) == ["b", "gateway"]
    # a's app answered 504 because its own call timed out: this finding's effect, not the app's own failure
    assert "the answer of the call it made for the request" in quoting[0]["explanation"]
    assert "not a failure of the mesh" not in quoting[0]["explanation"]


def _finding(pod: str, line: str, detector: str) -> Finding:
    return Finding(detector, Severity.ERROR, detector, NoFlow("counter", "x"), (), explanation=f"{detector}.",
                   pod=pod, access_log=(line,))


def test_a_fixed_request_id_pairs_each_callers_line_with_its_own_hop():
    """A client that sends one fixed x-request-id: two requests refused at the server 2 s apart, each on a
    connection of its own. Each server finding takes its own caller's line (the hop's four-tuple)."""
    fixed = "fixed-request-id"
    servers = [_finding("b", inbound(A, B, 503, "UF", fixed, dt + 0.001, port), "upstream-refused")
               for dt, port in ((0.0, 52000), (2.0, 52002))]
    callers = [_finding("a", outbound(A, B, 503, "-", fixed, dt, port), "next-hop")
               for dt, port in ((0.0, 52000), (2.0, 52002))]
    joined = join_hops([*servers, *callers])
    assert [len(f.access_log) for f in joined] == [2, 2]
    for f, caller in zip(joined, callers):
        assert caller.access_log[0] in f.access_log


def test_without_the_four_tuple_the_server_pods_address_tells_the_hop():
    """The caller's app called two pods of one service with one id (a fan-out passes its id on); the caller's
    format logged no %UPSTREAM_LOCAL_ADDRESS%. Its %UPSTREAM_HOST% is each server's %DOWNSTREAM_LOCAL_ADDRESS%."""
    servers = [_finding(pod.name, inbound(A, pod, 503, "UF", RID, 0.001, port, with_remote=False),
                        "upstream-refused") for pod, port in ((B, 52000), (B2, 52002))]
    callers = [_finding("a", outbound(A, pod, 503, "-", RID, 0.0, port, with_local=False), "next-hop")
               for pod, port in ((B2, 52002), (B, 52000))]
    joined = join_hops([*servers, *callers])
    assert [f.pod for f in joined] == ["b", "b2"]
    assert callers[1].access_log[0] in joined[0].access_log and callers[0].access_log[0] in joined[1].access_log


def test_an_id_alone_joins_only_when_it_is_unique():
    """Neither side logged an address: one id on two caller lines is no hop of either server line; on one, it
    is."""
    servers = [_finding("b", inbound(A, B, 503, "UF", RID, 0.001, 52000, with_remote=False, with_local=False),
                        "upstream-refused")]
    callers = [_finding("a", outbound(A, B, 503, "-", RID, dt, 52000, with_local=False, with_host=False),
                        "next-hop") for dt in (0.0, 1.0)]
    assert len(join_hops([*servers, *callers])) == 3
    assert len(join_hops([*servers, callers[0]])) == 1


def test_on_one_connection_the_nearest_in_time_pairs():
    """Requests kept alive on one connection, a client's id reused: each caller line pairs with the server line
    of the nearest start."""
    servers = [_finding("b", inbound(A, B, 503, "UF", "reused", dt + 0.001, 52000), "upstream-refused")
               for dt in (0.0, 0.5)]
    callers = [_finding("a", outbound(A, B, 503, "-", "reused", dt, 52000), "next-hop") for dt in (0.5, 0.0)]
    joined = join_hops([*servers, *callers])
    assert callers[1].access_log[0] in joined[0].access_log and callers[0].access_log[0] in joined[1].access_log
