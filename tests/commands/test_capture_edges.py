"""A failing access-log line whose request runs across an edge of the captures' span is context, not a finding
"cause not in this evidence": the part of the request where its cause would show was not captured. Found by a
new user's ``watch pod/stale-keepalive --duration 8``: the capture stopped between the app's ``GET /stale/2``
(lo) and its RST 200 ms later, and the sidecar's 503 UC line, read after, was reported as an error of the pod.

The data is real: the lab's stale-keepalive round with the caller's sidecar (tests/data/envoy-1.40-mesh/
stale-keepalive/server: lo and eth0 pcaps, the pod's log), its captures cut by tshark where that watch's stopped,
and the access-log lines of its log (a sidecar at Istio's default log levels logs only those). A line whose
request lies wholly inside the captures, with its cause not in them, is still that error."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kubectl_meshdoctor.core.events import AccessLogEvent, CaptureStartEvent
from kubectl_meshdoctor.core.findings import Severity
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.envoy.access_log import parse_line

from ..helpers import analyze_json

DATA = Path(__file__).resolve().parent.parent / "data"
SERVER = DATA / "envoy-1.40-mesh" / "stale-keepalive" / "server"
RETRY = DATA / "envoy-1.40-mesh-retry503" / "stale-keepalive" / "server"
NOT_IN_EVIDENCE = "connection closed under the request (cause not in this evidence)"
STILL_OPEN = ("1 failing access-log line(s) of requests still open at the end of the captures given (they ended "
              "after their last packet) were read as context, not judged")


def _access_lines(server: Path) -> str:
    return "".join(ln for ln in (server / "istio-proxy.log").read_text().splitlines(keepends=True)
                   if ln.startswith("[20"))


def _uc(server: Path):
    return next(e for ln in _access_lines(server).splitlines() if (e := parse_line(ln)) and "UC" in e.flags)


def _pod(tmp_path: Path, server: Path, ifaces: tuple[str, ...], before: float | None = None) -> Path:
    """A folder of ``server``'s captures of ``ifaces`` (each cut by tshark to the frames before ``before``,
    seconds since the epoch, when given) and the access-log lines of its log."""
    d = tmp_path / "stale-keepalive"
    d.mkdir(parents=True)
    for iface in ifaces:
        if before is None:
            shutil.copy(server / f"{iface}.pcap", d / f"{iface}.pcap")
        else:
            subprocess.run(["tshark", "-r", str(server / f"{iface}.pcap"), "-Y", f"frame.time_epoch < {before}",
                            "-w", str(d / f"{iface}.pcap")], check=True, capture_output=True, timeout=60)
    (d / "istio-proxy.log").write_text(_access_lines(server))
    return d


def _errors(report: dict) -> list[str]:
    return [f["variant"] for f in report["findings"] if f["severity"] == "error"]


def test_a_request_still_open_when_the_capture_stopped_is_context_and_found_in_the_whole_capture(tmp_path):
    uc = _uc(SERVER)
    end = uc.ts + uc.duration_ms / 1000
    # where the user's watch stopped: after the app got GET /stale/2 on lo, before its RST (200 ms later)
    cut = uc.ts + 0.08
    assert uc.ts < cut < end
    code, report = analyze_json(_pod(tmp_path / "cut", SERVER, ("lo", "eth0"), cut))
    assert code == 0 and not _errors(report), report["findings"]
    assert any(p["what"].startswith(STILL_OPEN) for p in report["problems"]), report["problems"]
    # The same line with the whole capture: the app's RST is in it, the packet finding quotes the line.
    code, report = analyze_json(_pod(tmp_path / "whole", SERVER, ("lo", "eth0")))
    assert code == 1
    (f,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert f["detector"] == "stale-keepalive" and "packets" in f["stands_on"]
    assert any('"GET /stale/2 HTTP/1.1" 503 UC' in line for line in f["access_log"]), f
    assert not any("read as context" in p["what"] for p in report["problems"])
    # A request wholly inside the captures, its cause not in them: the retried round's eth0 alone, whose packets
    # run past the 503 UC (the retry's connection); lo, where the app's RST is, is not given. Still the error.
    uc = _uc(RETRY)
    code, report = analyze_json(_pod(tmp_path / "inside", RETRY, ("eth0",)))
    assert code == 1 and _errors(report) == [NOT_IN_EVIDENCE], report["findings"]
    (f,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert f["ts"] == uc.ts and "outside_capture" not in f["details"]
    assert "Capture next: this pod's lo" in f["explanation"]
    assert not any("read as context" in p["what"] for p in report["problems"])


def test_a_line_decided_before_the_live_capture_began_is_context():
    """The TUI's start edge: the pod's log is followed first, and the quiet ticker decides a failing line older
    than the grace period while tcpdump is still starting (no capture start known yet, no packet): it began
    before the capture did."""
    uc = _uc(SERVER)
    p = Pipeline.with_detectors(pod="stale-keepalive")
    p.correlator.await_capture()
    p.context(AccessLogEvent(uc.ts, uc))
    p.tick(uc.ts + 6.0)
    p.context(CaptureStartEvent(uc.ts + 7.0))
    found = [f for f in p.finish() if f.severity is Severity.ERROR]
    assert not found and p.correlator.before_capture == 1, found
    assert "began before the capture did" in (p.correlator.before_capture_note() or "")


def test_a_line_of_a_request_begun_after_the_live_capture_stopped_is_context():
    """watch reads the sidecar's log on after its capture stopped (the access log is flushed late): a request begun
    after the stop had no packet to be seen. One begun before the stop, with no packet read, is judged as before."""
    uc = _uc(SERVER)
    for stopped, errors, context in ((uc.ts - 0.5, 0, 1), (uc.ts + 0.5, 1, 0)):
        p = Pipeline.with_detectors(pod="stale-keepalive")
        p.context(CaptureStartEvent(uc.ts - 5.0))
        p.correlator.judged_until = stopped
        p.context(AccessLogEvent(uc.ts, uc))
        found = [f for f in p.finish() if f.severity is Severity.ERROR]
        assert len(found) == errors and p.correlator.after_capture == context, (stopped, found)
        if context:
            assert "ended after the capture stopped" in (p.correlator.before_capture_note() or "")


def test_a_line_proven_by_the_log_alone_is_judged_wherever_the_capture_stopped():
    """Only a line whose cause packets show (UC, UF, UPE, DC...) is set aside at an edge: real Envoy's 503 UO
    (the circuit breaker's overflow, tests/data/envoy-1.40-mesh/overflow/caller) is proven by its own line, so one
    begun after the live capture stopped is still its detector's finding, not context."""
    log = DATA / "envoy-1.40-mesh" / "overflow" / "caller" / "istio-proxy.log"
    uo = next(e for ln in log.read_text().splitlines() if ln.startswith("[20") and (e := parse_line(ln))
              and "UO" in e.flags)
    p = Pipeline.with_detectors(pod="caller")
    p.context(CaptureStartEvent(uo.ts - 5.0))
    p.correlator.judged_until = uo.ts - 0.5
    p.context(AccessLogEvent(uo.ts, uo))
    found = [f for f in p.finish() if f.severity is Severity.ERROR]
    assert [f.detector for f in found] == ["circuit-breaker-overflow"] and p.correlator.after_capture == 0, found
