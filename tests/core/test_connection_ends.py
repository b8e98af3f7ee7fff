"""Which end of an eth0 connection a pod is (core/hop_path.py own_addresses, with_end), and one connection's
frames captured in both pods read as one finding, kept at the pod that opened it (core/wire_join.py same_connection).
The recordings are the lab's two-pod mesh (tests/data/envoy-1.40-mesh): the caller's eth0 and the server pod's
are the two ends of one veth."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.hop_path import hop_of, own_addresses, with_end
from kubectl_meshdoctor.core.wire_join import same_connection

from ..helpers import analyze_json

DATA = Path(__file__).resolve().parent.parent / "data"
CLIENT, SERVER = "198.18.2.1:39888", "198.18.2.2:5002"


def syn_timeout(pod: str, own: frozenset[str]) -> Finding:
    frames = tuple(Evidence(f"{pod}/eth0.pcap", "eth0", n, 1.0 + n, "SYN", CLIENT, SERVER, "S") for n in (1, 2))
    return with_end(Finding("syn-timeout", Severity.ERROR, "SYN retransmitted", FlowRef(CLIENT, SERVER, "eth0"),
                            frames, pod=pod, ts=1.0), own)


def test_a_pods_own_addresses_are_its_lo_syns_but_loopback():
    assert own_addresses(["127.0.0.1", "198.18.2.1", "::1", "127.0.0.6", "not-an-address"]) == {"198.18.2.1"}


@pytest.mark.parametrize("own, end, role", [
    (frozenset({"198.18.2.1"}), "client", "caller"),
    (frozenset({"198.18.2.2"}), "server", "server"),
    (frozenset(), None, ""),
    (frozenset({"198.18.2.1", "198.18.2.2"}), None, ""),  # both ends its own: it tells nothing
])
def test_the_end_is_told_by_the_pods_own_address_and_names_its_role(own, end, role):
    f = syn_timeout("p", own)
    assert f.details.get("end") == end
    assert hop_of(f).role == role


def test_one_connection_captured_in_both_pods_is_one_finding_at_the_pod_that_opened_it():
    server = syn_timeout("server", frozenset({"198.18.2.2"}))
    caller = syn_timeout("caller", frozenset({"198.18.2.1"}))
    for order in ([server, caller], [caller, server]):
        out = same_connection(order)
        assert [f.pod for f in out] == ["caller"]
        assert "server/eth0.pcap" in out[0].explanation
        assert hop_of(out[0]).also == ("server",)


def test_read_together_the_retransmitted_syns_are_the_callers_one_finding():
    root = DATA / "envoy-1.40-mesh" / "syn-drop"
    _, report = analyze_json(root / "caller", root / "server")
    found = [(f["detector"], f["pod"], f["details"].get("end"), f["hop"]["role"]) for f in report["findings"]]
    assert found == [("syn-timeout", "caller", "client", "caller")]


def test_two_pods_that_are_each_the_same_end_keep_their_own_readings():
    """Copies of one pod's capture under two names: both are the server end, so no veth joins them."""
    a, b = syn_timeout("a", frozenset({"198.18.2.2"})), syn_timeout("b", frozenset({"198.18.2.2"}))
    assert [f.pod for f in same_connection([a, b])] == ["a", "b"]
