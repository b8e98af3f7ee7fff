"""What the report says a capture of one interface could not show comes from the detectors' own declarations
(Detector.unseen_without, core/unseen.py): a detector's phrase is what not_seen says, each declared interface is
one its on_packet reads, the built-ins' words and order (their unseen_rank) are those the report carried before they
moved into the detectors (tests/data/reports/unnamed-iface.json), and a detector that gives no rank follows them."""

from __future__ import annotations

from kubectl_meshdoctor.core.detector import Detector, DetectorContext
from kubectl_meshdoctor.core.flows import FlowTable
from kubectl_meshdoctor.core.pipeline import Pipeline, merged_stats
from kubectl_meshdoctor.core.registry import load_detectors
from kubectl_meshdoctor.core.report_model import FilesSource, Report
from kubectl_meshdoctor.core.unseen import ROLES, missed_by

from ..helpers import A, P, Wire


class _Declaring(Detector):
    """An outside detector that reads eth0 alone and says what a run without it misses."""

    id = "test-declaring"
    packet_ifaces = frozenset({"eth0"})
    unseen_without = {"eth0": "the test class's packets", "ens5": "nothing a report can name"}

    def on_packet(self, ev, flow):
        return ()


def _lo_packets() -> list:
    w = Wire(iface="lo")
    w.handshake("127.0.0.6:40000", "198.18.0.2:8080")
    w.pkt("127.0.0.6:40000", "198.18.0.2:8080", P | A, 1001, 5001, http=b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
    return w.events


def _report(detectors: list[Detector], ctx: DetectorContext) -> Report:
    pipeline = Pipeline(detectors, ctx)
    for ev in _lo_packets():
        pipeline.feed(ev)
    return Report(FilesSource(("lo.pcap",)), pipeline.stats, pipeline.finish())


def test_a_detectors_declared_phrase_is_what_not_seen_says():
    ctx = DetectorContext(flows=FlowTable())
    built_in = load_detectors(ctx, only=["tuple-collision", "upstream-refused"])
    (u,) = _report([*built_in, _Declaring(ctx)], ctx).to_dict()["not_seen"]
    assert u == {"missing": "eth0",
                 "classes": [{"detector": "tuple-collision", "what": "the collision's challenge ACK"},
                             {"detector": "test-declaring", "what": "the test class's packets"}]}
    alone = DetectorContext(flows=FlowTable())
    line = _report([_Declaring(alone)], alone).unseen()[0].line()
    assert line == "not seen: lo only (no eth0 packet), so none of the test class's packets could show; give eth0 too"


def test_no_loaded_detector_declaring_the_missing_interface_says_nothing():
    ctx = DetectorContext(flows=FlowTable())
    report = _report(load_detectors(ctx, only=["upstream-refused", "http-framing"]), ctx)
    assert report.stats.by_iface["lo"].packets and report.unseen() == [] and "not_seen" not in report.to_dict()


def test_each_declared_interface_is_one_the_detector_reads_packets_of():
    declaring = [d for d in load_detectors(DetectorContext(flows=FlowTable())) if d.unseen_without]
    assert len(declaring) >= 10
    for det in declaring:
        assert set(det.unseen_without) <= set(ROLES), det.id
        assert type(det).on_packet is not Detector.on_packet, det.id  # a class of packets it never reads
        if det.packet_ifaces is not None:
            assert set(det.unseen_without) <= det.packet_ifaces, det.id
        assert all(what.strip() and "," not in what for what in det.unseen_without.values()), det.id


def test_the_built_ins_say_what_the_report_said_before_in_its_order():
    loaded = load_detectors(DetectorContext(flows=FlowTable()))
    missed = missed_by((d.id, d.unseen_rank, d.unseen_without) for d in loaded)
    by_iface = {i: [(m.detector, m.what) for m in missed if m.iface == i] for i in ROLES}
    assert by_iface["eth0"] == [
        ("tuple-collision", "the collision's challenge ACK"), ("syn-timeout", "SYN timeouts to other hosts"),
        ("tls-mismatch", "mTLS on the wire"), ("conntrack-invalid", "INVALID segments past the REDIRECT"),
        ("shutdown-ordering", "a stopped sidecar's refusals"),
        ("stale-keepalive", "callers reusing closed connections")]
    assert by_iface["lo"] == [
        ("upstream-refused", "the app refusing the sidecar"),
        ("startup-ordering", "the app starting before its sidecar"), ("http-framing", "malformed HTTP/1 responses"),
        ("server-first-protocol", "server-first apps"), ("stale-keepalive", "the app closing pooled connections")]
    backwards = missed_by((d.id, d.unseen_rank, d.unseen_without) for d in reversed(loaded))
    assert all([m for m in backwards if m.iface == i] == [m for m in missed if m.iface == i] for i in ROLES)
    assert all(d.unseen_rank < Detector.unseen_rank for d in loaded if d.unseen_without)


class _First(_Declaring):
    """An outside detector whose class a reader needs eth0 for before any built-in's."""

    id = "test-first"
    unseen_rank = 5
    unseen_without = {"eth0": "the test's first class"}


class _TiedWithTheCollision(_Declaring):
    """An outside detector giving tuple-collision's rank: listed after it, which loads first."""

    id = "test-tied"
    unseen_rank = 10
    unseen_without = {"eth0": "the test's tied class"}


def test_the_report_lists_by_rank_then_load_order_and_a_detector_giving_no_rank_after_the_built_ins():
    ctx = DetectorContext(flows=FlowTable())
    built_in = load_detectors(ctx)
    # Loaded after the built-ins, as outside packages' detectors are (core/registry.py).
    (u,) = _report([*built_in, _Declaring(ctx), _TiedWithTheCollision(ctx), _First(ctx)], ctx).to_dict()["not_seen"]
    assert [c["detector"] for c in u["classes"]] == [
        "test-first", "tuple-collision", "test-tied", "syn-timeout", "tls-mismatch", "conntrack-invalid",
        "shutdown-ordering", "stale-keepalive", "test-declaring"]


def test_several_pods_stats_keep_the_declarations():
    pipelines = [Pipeline.with_detectors(pod=pod) for pod in ("a", "b")]
    for ev in _lo_packets():
        pipelines[1].feed(ev)
    stats = merged_stats(pipelines)
    (u,) = Report(FilesSource(("b-lo.pcap",)), stats, []).unseen()
    assert (u.pod, u.missing) == ("b", "eth0") and ("tuple-collision", "the collision's challenge ACK") in u.classes


def test_captured_says_the_interfaces_read_and_none_for_a_time_outside_every_packet_read():
    from kubectl_meshdoctor.core.unseen import IfaceStats, captured

    by_iface = {"lo": IfaceStats(5, 100.0, 200.0), "eth0": IfaceStats(2, 100.0, 101.0), "any": IfaceStats(0)}
    assert captured(by_iface) == ("lo", "eth0") == captured(by_iface, 150.0, 150.2)  # eth0's reads stop earlier
    assert captured(by_iface, 90.0, 100.5) == ("lo", "eth0")  # the request overlaps the span's start
    assert captured(by_iface, 50.0, 60.0) == () == captured(by_iface, 250.0)  # before, after every packet read
    assert captured({"lo": IfaceStats(3, 1.0, 2.0), "eth0": IfaceStats(0)}, 1.5) == ("lo",)
    assert captured({}) == () == captured({}, 1.0)
