"""The ladder diagram: which lanes each evidence packet joins, its label and relative time."""

from kubectl_meshdoctor.core.events import PacketEvent, TcpFlags
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.frontends.ladder import LANES, arrows, render_ladder

APP, SIDECAR = ("198.18.1.2", 8080), ("127.0.0.6", 41000)


def _pkt(frame: int, ts: float, src, dst, flags: TcpFlags, payload: int = 0, iface: str = "lo") -> PacketEvent:
    return PacketEvent(ts, iface, f"p/{iface}", frame, src[0], src[1], dst[0], dst[1], flags, 1, 1, payload)


def _stale_keepalive() -> Finding:
    fin = _pkt(10, 100.0, APP, SIDECAR, TcpFlags.FIN | TcpFlags.ACK)
    req = _pkt(11, 100.0021, SIDECAR, APP, TcpFlags.PSH | TcpFlags.ACK, 120)
    rst = _pkt(12, 100.0030, APP, SIDECAR, TcpFlags.RST)
    return Finding("stale-keepalive", Severity.ERROR, "t", FlowRef("127.0.0.6:41000", "198.18.1.2:8080", "lo"),
                   (Evidence.of(fin, "FIN"), Evidence.of(req, "request"), Evidence.of(rst, "RST"),
                    Evidence("p/access.log", "", 3, 100.1, "log line")))


def test_lo_packets_run_between_sidecar_and_app_in_time_order():
    a = arrows(_stale_keepalive())
    assert [(LANES[x.start], LANES[x.end]) for x in a] == [("app (lo)", "sidecar"), ("sidecar", "app (lo)"),
                                                           ("app (lo)", "sidecar")]
    assert [x.label for x in a] == ["F. :8080→:41000", "P. :41000→:8080 120B", "R :8080→:41000"]
    assert [round(x.rel_ms, 1) for x in a] == [0.0, 2.1, 3.0]


def test_render_draws_arrowheads_on_the_receiving_side_and_notes_the_rest():
    lines = render_ladder(_stale_keepalive())
    fin, req = (next(line for line in lines if f"#{n} " in line) for n in (10, 11))
    assert fin.index("◀") < fin.rindex("│") and fin.rstrip().endswith("#10 FIN")
    assert "▶" in req and "+2.100" in req
    assert lines[-1].strip().startswith("⋮ p/access.log line 3: log line")


def test_eth0_packet_from_the_pod_goes_to_the_client():
    syn = _pkt(1, 5.0, ("198.18.2.9", 40811), ("198.18.1.2", 9090), TcpFlags.SYN, iface="eth0")
    ack = _pkt(2, 5.001, ("198.18.1.2", 9090), ("198.18.2.9", 40811), TcpFlags.ACK, iface="eth0")
    f = Finding("tuple-collision", Severity.ERROR, "t", FlowRef("198.18.2.9:40811", "198.18.1.2:9090", "eth0"),
                (Evidence.of(syn, "SYN"), Evidence.of(ack, "challenge ACK")))
    assert [(LANES[x.start], LANES[x.end]) for x in arrows(f)] == [("client", "sidecar"), ("sidecar", "client")]


def test_no_packet_evidence_no_diagram():
    f = Finding("lint", Severity.WARNING, "t", FlowRef("-", "pod:1", ""), (Evidence("spec", "", 0, 0.0, "x"),))
    assert render_ladder(f) == []


def test_fitted_to_a_width_every_line_fits_and_each_row_keeps_its_frame_and_name():
    f = _stale_keepalive()
    f = Finding(f.detector, f.severity, f.title, f.flow, f.evidence + (
        Evidence("p/" + "a-long-capture-name" * 6 + ".pcap", "", 4, 100.2, "first packet of the live connection"),))
    for width in (66, 76, 84, 120):  # below ~64 the lanes stop shrinking and the pane scrolls (_MIN_LANES)
        lines = render_ladder(f, width)
        assert all(len(line) <= width for line in lines), (width, [len(x) for x in lines])
        assert [line.rstrip().rsplit("  ", 1)[1] for line in lines[2:5]] == ["#10 FIN", "#11 request", "#12 RST"]
        notes = " ".join(line.strip(" ⋮") for line in lines[5:])  # wrapped under themselves, nothing lost
        assert "first packet of the live connection" in notes and "a-long-capture-name" in notes, notes
    assert render_ladder(f) == render_ladder(f, None)  # a report's: the diagram's own width, as before
