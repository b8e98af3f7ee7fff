"""bench/many's reading of watch and its judging: the live finding line as watch writes it, a report without
tcpdump's counts proving no "no drop", a run with no latency printed. No lab, nothing timed."""

from __future__ import annotations

from kubectl_meshdoctor.core.findings import FlowRef
from tests.bench.test_gen import _load

many = _load("many")


def _line(severity: str, detector: str, title: str, flow: FlowRef) -> str:
    # commands/watch/__init__.py's on_finding, without its terminal control
    return f"{severity}: {detector}: {title} ({flow.text(labelled=False)})"


def test_the_live_line_watch_writes_gives_its_detector_and_flow():
    m = many.FINDING.match(_line("error", "tuple-collision", "A four-tuple (client:port) reused",
                                 FlowRef("198.18.2.1:40123", "198.18.2.2:5002", "eth0")))
    assert m and m.group(2) == "tuple-collision"
    assert (m.group(4), m.group(5)) == ("198.18.2.1:40123", "198.18.2.2:5002")
    m = many.FINDING.match(_line("error", "upstream-refused", "x", FlowRef("127.0.0.6:1", "127.0.0.1:9", "")))
    assert m and (m.group(4), m.group(5)) == ("127.0.0.6:1", "127.0.0.1:9")


def _result(pods: int, **kw) -> dict:
    r = {"pods": pods, "rss_peak_mb": 300.0, "planted": pods, "found": pods, "latency_p99_s": 0.3,
         "latency_median_s": 0.05, "dropped_by_kernel": 0, "unanalysed": 0, "interfaces_counted": 2 * pods,
         "cpu_cores": 0.5, "cpu_us_per_crossing_packet": 120.0, "achieved_pps": 4000.0, "crossing_packets": 9,
         "rss_peak_by_process_mb": {}, "rate": 40.0}
    return {**r, **kw}


def test_every_goal_met_passes():
    lines, ok = many.verdict([_result(10), _result(100, rss_peak_mb=390.0)])
    assert ok and sum(line.startswith("PASS") for line in lines) == 4
    assert "cost of a pod: 1.0 MB" in lines[-1]


def test_no_counts_is_no_proof_of_no_drop():
    lines, ok = many.verdict([_result(100, interfaces_counted=0)])
    assert not ok
    assert [line for line in lines if line.startswith("FAIL")] == [
        "FAIL: 100 pods: 0 dropped by the kernel, 0 unanalysed, 0/200 interfaces counted (goal 0, 0, all)"]


def test_a_miss_or_a_slow_finding_fails():
    assert not many.verdict([_result(100, found=99)])[1]
    assert not many.verdict([_result(100, latency_p99_s=None)])[1]
    assert not many.verdict([_result(100, latency_p99_s=2.0)])[1]


def test_a_run_without_latencies_still_prints_its_table(capsys):
    many.print_table([_result(10, latency_median_s=None, latency_p99_s=None, cpu_us_per_crossing_packet=None)])
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:2] == ["10", "300.0"] and row[9:11] == ["-", "-"]
