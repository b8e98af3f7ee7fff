"""What an unproven stale-keepalive finding (503 UC from Envoy's access log or counters, no packet naming the race)
advises next: to capture this pod's lo or eth0 only when the run read no packet of it (or none of the captures
spans the request), else what in the captures given to look at; an outbound line's upstream pod is not this
pod's run's to know, so it is still asked for. The cases with captures over the request failed before the advice
looked at what was captured; those with none, or an outbound line, keep the words it had."""

from __future__ import annotations

from pathlib import Path

from kubectl_meshdoctor.core.events import AccessLogEvent, EnvoyCountersEvent
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.envoy.access_log import parse_line

from ..helpers import A, F, P, Wire

LOG = Path(__file__).resolve().parent.parent / "envoy" / "data" / "component_log" / "stale-keepalive.log"
# Real Envoy 1.40's line of the lab's round: 503 UC on the inbound cluster, 127.0.0.6:53940 -> 198.18.1.2:5000.
LINE = next(ln for ln in LOG.read_text().splitlines() if ln.startswith("[20") and '" 503 UC ' in ln)
CAPTURE_BOTH = "Capture next: this pod's eth0 and lo (kubectl meshdoctor watch pod/<pod>"


def _served(iface: str, t0: float, client: str, server: str) -> list:
    """A request answered and closed cleanly on ``iface``, starting at ``t0``: traffic, no race."""
    w = Wire(iface=iface, t0=t0)
    w.handshake(client, server)
    w.pkt(client, server, P | A, 1001, 5001, http=b"GET /ok HTTP/1.1\r\nhost: a\r\n\r\n")
    w.pkt(server, client, P | A, 5001, 1030, http=b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    w.pkt(client, server, F | A, 1030, 5040, dt=0.2)
    w.pkt(server, client, F | A, 5040, 1031)
    return w.events


def _run(ifaces: tuple[str, ...], line: str = LINE, times: tuple[float, ...] = (-2.0, 2.0),
         eth0_times: tuple[float, ...] | None = None) -> list:
    """The pipeline of stale-keepalive over ``ifaces``' packets, a served request at each of ``times`` (seconds
    from the line's request; ``eth0_times`` for eth0's), with the line read at its request's end, in time order."""
    entry = parse_line(line)
    assert entry is not None and entry.ts > 0
    ends = {"lo": ("127.0.0.6:53000", "198.18.1.2:5000"), "eth0": ("198.18.1.1:33000", "198.18.1.2:5000")}
    packets = sorted((ev for i in ifaces for t in (eth0_times if i == "eth0" and eth0_times is not None else times)
                      for ev in _served(i, entry.ts + t, *ends[i])), key=lambda e: e.ts)
    end = entry.ts + entry.duration_ms / 1000
    p = Pipeline.with_detectors(only=["stale-keepalive"])
    for ev in (ev for ev in packets if ev.ts < end):
        p.feed(ev)
    p.context(AccessLogEvent(end, entry, "access.log", 1))
    for ev in (ev for ev in packets if ev.ts >= end):
        p.feed(ev)
    return p.finish()


def _counted(ifaces: tuple[str, ...]) -> list:
    entry = parse_line(LINE)
    stats = {"cluster.inbound|5000||.upstream_cx_destroy_remote_with_active_rq": 2,
             "cluster.inbound|5000||.upstream_cx_http1_total": 9}
    p = Pipeline.with_detectors(only=["stale-keepalive"])
    for ev in sorted((ev for i in ifaces for ev in _served(i, entry.ts, "127.0.0.6:53000" if i == "lo" else
                                                           "198.18.1.1:33000", "198.18.1.2:5000")),
                     key=lambda e: e.ts):
        p.feed(ev)
    p.context(EnvoyCountersEvent(entry.ts + 3, {"inbound|5000||": {k.split(".")[-1]: v for k, v in stats.items()}},
                                 stats, source="stats.txt"))
    (f,) = p.finish()
    assert "cause not in the counters" in f.title
    return [f]


def test_with_no_packet_of_the_pod_it_says_to_capture_its_lo_and_eth0():
    (f,) = _run(())
    assert f.details["proven"] is False and CAPTURE_BOTH in f.explanation
    assert "Capture the upstream pod" in f.remediation


def test_with_the_pods_lo_and_eth0_given_it_says_what_in_them_to_look_at_not_to_capture_them():
    (f,) = _run(("lo", "eth0"))
    assert f.details["proven"] is False
    assert "Capture next: this pod's" not in f.explanation and "eth0 and lo (kubectl" not in f.explanation
    assert "Look next in the captures given of this pod's lo and eth0" in f.explanation
    assert "127.0.0.6:53940 to 198.18.1.2:5000" in f.explanation  # the line's own upstream leg, to find on lo
    assert "--envoy-debug" in f.explanation  # the debug log was not given: still worth capturing
    assert "Capture the upstream pod" not in f.remediation and "--envoy-debug" in f.remediation


def test_with_lo_alone_given_it_says_to_capture_eth0_and_what_to_look_at_on_lo():
    (f,) = _run(("lo",))
    assert "Capture next: this pod's eth0 (kubectl meshdoctor watch pod/<pod>" in f.explanation
    assert "Look next in the capture given of this pod's lo" in f.explanation and "on eth0," not in f.explanation


def test_an_outbound_line_still_says_to_capture_the_upstream_pod():
    # The caller's sidecar's line of its outbound cluster: the upstream is another pod, whose captures this
    # pod's pipeline cannot know of.
    line = LINE.replace("inbound|5000||", "outbound|5000||app.default.svc.cluster.local")
    (f,) = _run(("lo", "eth0"), line)
    assert "Capture next: the upstream pod's eth0 and lo (kubectl meshdoctor watch pod/<pod>" in f.explanation


def test_the_counters_finding_names_the_captures_given_of_an_inbound_cluster():
    (bare,) = _counted(())
    assert "Capture next: the upstream pod (kubectl meshdoctor watch pod/<pod>)" in bare.explanation
    (given,) = _counted(("lo", "eth0"))
    assert "Capture next: the upstream pod" not in given.explanation
    assert "Look next in the captures given of this pod's lo and eth0" in given.explanation
    assert "Capture the upstream pod" not in given.remediation


def test_captures_that_end_before_the_request_are_not_over_it_so_it_says_to_capture_while_it_happens():
    # The line lies outside the captures given (analyze says so before the explanation: commands/outside_span.py).
    (f,) = _run(("lo", "eth0"), times=(-60.0, -50.0))
    assert CAPTURE_BOTH in f.explanation and "Look next" not in f.explanation
    assert "Capture the upstream pod" in f.remediation


def test_an_interface_whose_packets_read_stop_earlier_is_still_given():
    # The reader keeps only the packets a detector may act on: eth0's capture ran on with none of them kept.
    (f,) = _run(("lo", "eth0"), eth0_times=(-2.0,))
    assert "Look next in the captures given of this pod's lo and eth0" in f.explanation
    assert "Capture next: this pod's" not in f.explanation
