"""Which detectors the pipeline hands a packet to (Detector.packet_ifaces): those that read its interface and
override on_packet, in their order; and each built-in detector's declaration says what its on_packet does."""

from __future__ import annotations

from kubectl_meshdoctor.core.detector import Detector, DetectorContext
from kubectl_meshdoctor.core.flows import FlowTable
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.core.registry import load_detectors

from ..helpers import A, P, R, Wire


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
