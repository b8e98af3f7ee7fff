"""The packets pane's typed filter and the per-finding selection."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubectl_meshdoctor.core.events import PacketEvent, TcpFlags
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.frontends.tui.packet_filter import FilterError, PacketFilter, of_finding


def _ev(src="198.18.1.1", sport=40811, dst="198.18.1.2", dport=5002, flags=TcpFlags.SYN, iface="eth0", frame=1):
    return PacketEvent(1.0, iface, f"p/{iface}", frame, src, sport, dst, dport, flags, 1, 0)


@pytest.mark.parametrize("text, hit, miss", [
    ("198.18.1.1", _ev(), _ev(src="198.18.1.9")),
    ("5002", _ev(), _ev(dport=5000)),
    ("port:40811 eth0", _ev(), _ev(iface="lo")),
    ("R", _ev(flags=TcpFlags.RST | TcpFlags.ACK), _ev()),
    ("S.", _ev(flags=TcpFlags.SYN | TcpFlags.ACK), _ev()),
    ("frame:7 host:198.18.1.2", _ev(frame=7), _ev(frame=8)),
    ("iface:lo", _ev(iface="lo"), _ev()),
])
def test_terms_select_and_reject(text, hit, miss):
    f = PacketFilter.parse(text)
    assert f.matches(hit) and not f.matches(miss)


@pytest.mark.parametrize("text", ["bogus", "port:70000", "flag:X", "host:1.2.3", "frame:-1"])
def test_a_term_it_does_not_understand_is_named(text):
    with pytest.raises(FilterError, match="not understood"):
        PacketFilter.parse(text)


@given(st.integers(0, 65535), st.integers(0, 65535))
def test_a_port_term_matches_either_end(sport, dport):
    f = PacketFilter.parse(str(sport))
    assert f.matches(_ev(sport=sport, dport=dport))


def test_of_finding_keeps_the_client_endpoint_on_its_interface_and_the_evidence():
    syn = _ev(frame=19)
    f = Finding("tuple-collision", Severity.ERROR, "t", FlowRef("198.18.1.1:40811", "198.18.1.2:5002", "eth0"),
                (Evidence.of(syn, "SYN"), Evidence("other", "eth0", 3, 0.0, "x")))
    assert of_finding(f, _ev(frame=40, dport=5000))  # the client's other connection
    assert not of_finding(f, _ev(frame=41, sport=40812))
    assert not of_finding(f, _ev(frame=42, iface="lo"))
    assert of_finding(f, PacketEvent(0.0, "lo", "other", 3, "127.0.0.6", 1, "127.0.0.1", 2, TcpFlags.ACK, 0, 0))
