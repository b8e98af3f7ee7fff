"""Which detectors the pipeline hands a packet to (Detector.packet_ifaces): those that read its interface and
override on_packet, in their order; and each built-in detector's declaration says what its on_packet does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kubectl_meshdoctor.core.detector import PACKET_KINDS, Detector, DetectorContext, kinds_mask
from kubectl_meshdoctor.core.events import PacketEvent
from kubectl_meshdoctor.core.flows import FlowTable
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.core.registry import load_detectors

from ..helpers import A, P, R, Wire
from ..sources.test_fastpath import stream


def _recording(name: str, ifaces, calls: list):
    class Recording(Detector):
        id = name
        packet_ifaces = ifaces

        def on_packet(self, ev, flow):
            calls.append((name, ev.iface, ev.frame))
            return ()

    return Recording


def _packets(iface: str) -> list:
    w = Wire(iface=iface)
    w.handshake("198.18.0.1:40000", "198.18.0.2:8080")
    w.pkt("198.18.0.1:40000", "198.18.0.2:8080", P | A, 1001, 5001, http=b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
    w.pkt("198.18.0.2:8080", "198.18.0.1:40000", R, 5001, 0)
    return w.events


def test_a_packet_goes_only_to_the_detectors_that_read_its_interface_in_their_order():
    calls: list = []
    ctx = DetectorContext(flows=FlowTable())
    detectors = [_recording("every", None, calls)(ctx), _recording("lo-only", frozenset({"lo"}), calls)(ctx),
                 _recording("both", frozenset({"lo", "eth0"}), calls)(ctx)]
    pipeline = Pipeline(detectors, ctx)
    for iface in ("eth0", "lo", "ens5"):
        for ev in _packets(iface):
            pipeline.feed(ev)
    seen = {(name, iface) for name, iface, _ in calls}
    assert seen == {("every", "eth0"), ("every", "lo"), ("every", "ens5"), ("lo-only", "lo"), ("both", "lo"),
                    ("both", "eth0")}
    lo = [name for name, iface, frame in calls if iface == "lo" and frame == 1]
    assert lo == ["every", "lo-only", "both"]


def test_each_built_in_detector_reads_no_packet_of_an_interface_it_does_not_declare():
    ctx = DetectorContext(flows=FlowTable())
    declared = [d for d in load_detectors(ctx) if d.packet_ifaces is not None]
    assert len(declared) >= 5
    for det in declared:
        for iface in {"lo", "eth0", "ens5"} - det.packet_ifaces:
            flows = FlowTable()
            for ev in _packets(iface):
                flow = flows.observe(ev)
                assert not list(det.on_packet(ev, flow)), (det.id, iface)
                assert not flow.notes, (det.id, iface)


def test_a_packet_goes_only_to_the_detectors_that_read_one_of_its_kinds():
    calls: list = []

    def kinds_of(name: str, kinds):
        cls = _recording(name, None, calls)
        cls.packet_kinds = kinds
        return cls

    ctx = DetectorContext(flows=FlowTable())
    detectors = [kinds_of("every", None)(ctx), kinds_of("http", frozenset({"http"}))(ctx),
                 kinds_of("close", frozenset({"fin", "rst"}))(ctx), kinds_of("syn", frozenset({"syn"}))(ctx)]
    pipeline = Pipeline(detectors, ctx)
    events = _packets("eth0")  # SYN, SYN-ACK, ACK, the GET, the RST
    for ev in events:
        pipeline.feed(ev)
    by_frame: dict[int, list[str]] = {}
    for name, _, frame in calls:
        by_frame.setdefault(frame, []).append(name)
    assert [by_frame[ev.frame] for ev in events] == [["every", "syn"], ["every", "syn"], ["every"],
                                                     ["every", "http"], ["every", "close"]]


def test_a_misspelt_kind_is_refused():
    with pytest.raises(ValueError, match="unknown packet kind"):
        kinds_mask(frozenset({"http", "fn"}))
    assert kinds_mask(None) == kinds_mask(frozenset(PACKET_KINDS))


DATA = Path(__file__).resolve().parent.parent / "data"
CAPTURES = sorted(p for p in DATA.rglob("*") if p.suffix in (".pcap", ".pcapng"))


@pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")
def test_every_recording_gives_the_same_findings_with_and_without_the_kinds_declared(monkeypatch):
    """Each built-in declaration of Detector.packet_kinds holds on every capture in tests/data: the detectors'
    findings are the same when every detector is handed every packet."""
    declared = {type(d) for d in load_detectors(DetectorContext(flows=FlowTable())) if d.packet_kinds is not None}
    assert len(declared) >= 5
    # read through the pre-pass's fast path, which gives tshark's events (tests/sources/test_fastpath.py) without
    # a tshark a file: CI's time
    streams = [(path, [ev for ev in stream(path, True, monkeypatch)[0] if isinstance(ev, PacketEvent)])
               for path in CAPTURES]

    def findings() -> list:
        out = []
        for path, events in streams:
            pipeline = Pipeline.with_detectors()
            for ev in events:
                pipeline.feed(ev)
            out.append((path.name, [(f.detector, f.variant, f.ts, f.envoy_flags, f.evidence) for f in
                                     pipeline.finish()]))
        return out

    declared_run = findings()
    assert sum(len(found) for _, found in declared_run) >= 50
    for cls in declared:
        monkeypatch.setattr(cls, "packet_kinds", None)
    assert findings() == declared_run
