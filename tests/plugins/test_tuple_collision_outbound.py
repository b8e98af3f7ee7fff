"""The outbound variant of tuple-collision on captures recorded from the mesh lab's caller sidecar
(tests/data/README.md: lab-outbound-stale-*), and syn-timeout's wording on the same SYNs: an answered SYN is never
called dropped."""

import asyncio
import subprocess
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.findings import Severity
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources.files import CaptureArg
from kubectl_meshdoctor_plugins.tuple_collision import OUTBOUND_VARIANT

DATA = Path(__file__).parent.parent / "data"
pytestmark = pytest.mark.skipif(not Path("/usr/bin/tshark").exists(), reason="needs tshark")


def _findings(*names):
    report = asyncio.run(analyze([CaptureArg.parse(str(DATA / n)) for n in names], Pipeline.with_detectors()))
    return [f for f in report.findings if f.flow.iface]


@pytest.mark.parametrize("prepass", ["0", "1"])
def test_both_outcomes_are_the_outbound_collision_with_the_old_connections_ack(monkeypatch, prepass):
    """The real read path, display filter and (forced, as for a file over its threshold) the record pre-pass:
    the stale socket's ACK is on the conversation tshark files the de-NATed replies under, which saw the old
    connection's FIN and never a SYN (FILE_PREFILTER keeps it)."""
    monkeypatch.setenv("MESHDOCTOR_PREPASS", prepass)
    found = _findings("lab-outbound-stale-lo.pcap", "lab-outbound-stale-eth0.pcap")
    mine = sorted((f for f in found if f.detector == "tuple-collision"), key=lambda f: f.ts)
    assert [f.variant for f in mine] == [OUTBOUND_VARIANT] * 2
    retried, stalled = mine
    assert retried.severity is Severity.WARNING and not retried.details["stalled"]
    assert 0 < retried.details["lost_s"] < 0.1  # the RST got through: the resent SYN succeeded at once
    assert [e.flags for e in retried.evidence] == ["S", ".", "R", "S."]
    assert stalled.severity is Severity.ERROR and stalled.details["stalled"]
    assert [e.flags for e in stalled.evidence] == ["S", ".", "S"]  # no RST: dropped before lo
    for f in mine:
        syn, ack = f.evidence[0], f.evidence[1]
        assert syn.dst == "127.0.0.1:15001" and ack.dst == syn.src and "old connection" in ack.what
        assert not f.envoy_flags and [x.name for x in f.fixes] == ["client-port"]
        assert "not dropped" in f.explanation
    assert not [f for f in found if f.detector == "syn-timeout"]


def test_syn_timeout_never_calls_the_answered_syn_dropped_when_the_answer_was_not_captured():
    """The same stall recorded with the lean filter of before (no pure ACKs on lo): the tool once said "something
    between drops it". The SYN resent at once shows it was answered: an honest "cannot tell", with what to
    capture next."""
    (f,) = [f for f in _findings("lab-outbound-stale-noack-lo.pcap") if f.flow.client.endswith(":41021")]
    assert f.detector == "syn-timeout" and f.variant == "SYN answered, answer not captured"
    assert "drops" not in f.explanation and "cannot tell" in f.explanation and "--full-capture" in f.explanation
    assert f.severity is Severity.ERROR


def test_an_ordinary_outbound_connect_on_lo_is_no_collision():
    from ..helpers import A, S, Wire, run

    w = Wire(iface="lo")
    w.handshake("198.18.0.1:41000", "127.0.0.1:15001")  # SYN-ACK as if from the listener itself
    w.pkt("198.18.0.1:41001", "127.0.0.1:15001", S, 7000)
    w.pkt("198.18.0.2:5000", "198.18.0.1:41001", S | A, 9000, 7001)  # its source restored by conntrack
    w.pkt("198.18.0.1:41001", "127.0.0.1:15001", A, 7001, 9001)
    assert run(w.events, only=["tuple-collision", "syn-timeout"]) == []


@pytest.mark.parametrize("prepass", ["0", "1"])
def test_a_capture_begun_after_the_old_connections_fin_still_names_it(monkeypatch, tmp_path, prepass):
    """watch started while the sidecar's socket already waited in FIN-WAIT-2: the capture (frames 7 on of the
    recording) holds nothing of the old connection, and the stale ACK is the first frame of its conversation
    (tcp.completeness 0), which the display filter and the pre-pass keep."""
    cut = tmp_path / "lo.pcap"
    subprocess.run(["editcap", "-r", str(DATA / "lab-outbound-stale-lo.pcap"), str(cut), "7-33"], check=True,
                   capture_output=True)
    monkeypatch.setenv("MESHDOCTOR_PREPASS", prepass)
    report = asyncio.run(analyze([CaptureArg.parse(str(cut))], Pipeline.with_detectors()))
    mine = sorted((f for f in report.findings if f.detector == "tuple-collision"), key=lambda f: f.ts)
    assert [f.variant for f in mine] == [OUTBOUND_VARIANT] * 2
    assert [[(e.flags, e.frame) for e in f.evidence] for f in mine] == [
        [("S", 1), (".", 2), ("R", 3), ("S.", 5)], [("S", 17), (".", 18), ("S", 20)]]


def test_a_dead_sidecars_time_wait_socket_then_a_refusal_is_no_collision():
    """The app's port meets the killed sidecar's TIME-WAIT socket (its ACK, the app's RST), then the resent SYN is
    refused: the refusal is the failure, named as the sidecar going down, and no collision is reported."""
    found = _findings("lab-sidecar-crash-reused-port-lo.pcap")
    assert not [f for f in found if f.detector == "tuple-collision"], found
    (refused,) = [f for f in found if f.severity is Severity.ERROR]
    assert refused.detector == "startup-ordering" and refused.flow.client.endswith(":40123")
    assert [e.frame for e in refused.evidence if e.kind == "packet"][:2] == [12, 13]
