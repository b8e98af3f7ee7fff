"""analyze's JSON report of every capture and log the repository holds, field by field against the report the
tree printed before issue 30 moved it (tests/data/reports/): a move of modules must not move a finding.

The inputs are read as a user passes them (paths relative to the repository). To record the reports anew, on
purpose: MESHDOCTOR_RECORD_REPORTS=1 python -m pytest tests/frontends/report/test_golden_reports.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parents[2]
GOLDEN = ROOT / "tests" / "data" / "reports"
DATA, ENVOY = "tests/data", "tests/envoy/data"


def _cases() -> dict[str, list[str]]:
    cases = {
        "lab-collision": [f"{DATA}/lab-collision-lo.pcap", f"{DATA}/lab-collision-eth0.pcap"],
        "lab-collision3m": [f"{DATA}/lab-collision3m-lo.pcap", f"{DATA}/lab-collision3m-eth0.pcap",
                            f"{DATA}/lab-collision3m-access.log"],
        "lab-framing-mixed": [f"{DATA}/lab-framing-mixed-lo.pcap", f"{DATA}/lab-framing-mixed-eth0.pcap",
                              f"{DATA}/lab-framing-mixed-access.log"],
        "unnamed-iface": [f"{DATA}/unnamed-iface-eth0.pcapng"],
        "lab-collision3m-access-alone": [f"{DATA}/lab-collision3m-access.log"],
    }
    for d in sorted((ROOT / DATA / "envoy-1.40").iterdir()):
        if d.is_dir():
            files = [f"{DATA}/envoy-1.40/{d.name}/{n}" for n in ("istio-proxy.log", "stats-after.txt", "clusters.txt")
                     if (d / n).exists()]
            cases[f"envoy-1.40-{d.name}"] = files
    for name in ("clusters.json", "clusters.txt", "clusters_legacy.txt", "istio_access_log.txt", "stats_sample.txt",
                 "stats_sample_legacy.txt"):
        cases[f"envoy-data-{name}"] = [f"{ENVOY}/{name}"]
    for log in sorted((ROOT / ENVOY / "component_log").glob("*.log")):
        cases[f"component-log-{log.stem}"] = [f"{ENVOY}/component_log/{log.name}"]
    return cases


CASES = _cases()


def analyze(files: list[str]) -> dict:
    """The exit code, the JSON report, and the wall-clock window (seconds since the epoch) the run read in."""
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *files, "-o", "json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return {"exit": proc.returncode, "report": json.loads(proc.stdout) if proc.stdout.strip() else None,
            "read": [started, time.time()]}


def differences(old, new, where: str = "", windows: tuple[tuple[float, float], ...] = ()) -> list[str]:
    """Where ``new`` differs from ``old``, each as a path and the two values. An evidence item may say its kind
    (issue 30's typed Evidence) where the recorded one did not. A counter read from an admin dump, which holds no
    time of its own, is stamped when it is read (a finding from /stats alone, its counters, its group): a time that
    lies in the window the run read its inputs in (``windows``: old's, new's) is such a stamp, and is not compared
    but for being one in both."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            if key not in old and key == "kind" and "/evidence/" in where + "/":
                continue
            if key.endswith("ts") and windows and _stamped(old.get(key), windows[0]) \
                    and _stamped(new.get(key), windows[1]):
                continue
            if key not in old or key not in new:
                out.append(f"{where}/{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"[:300])
            else:
                out += differences(old[key], new[key], f"{where}/{key}", windows)
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: {len(old)} items -> {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{where}/{i}", windows)]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"[:300]]


def _stamped(value, window: tuple[float, float]) -> bool:
    return isinstance(value, float) and window[0] <= value <= window[1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_report_of_each_input_is_what_it_was(case):
    now = analyze(CASES[case])
    golden = GOLDEN / f"{case}.json"
    if os.environ.get("MESHDOCTOR_RECORD_REPORTS") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps({"files": CASES[case], **now}, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(golden.read_text())
    assert recorded["files"] == CASES[case]
    windows = (tuple(recorded["read"]), tuple(now["read"]))
    assert differences({"exit": recorded["exit"], "report": recorded["report"]},
                       {"exit": now["exit"], "report": now["report"]}, windows=windows) == []


def test_the_comparison_sees_a_moved_field():
    """The comparison itself can fail: a changed value, a lost key, a lost finding."""
    base = {"report": {"findings": [{"evidence": [{"frame": 3}], "title": "t"}]}}
    assert differences(base, base) == []
    assert differences(base, {"report": {"findings": [{"evidence": [{"frame": 3, "kind": "packet"}],
                                                      "title": "t"}]}}) == []
    assert differences(base, {"report": {"findings": [{"evidence": [{"frame": 4}], "title": "t"}]}})
    assert differences(base, {"report": {"findings": [{"evidence": [{"frame": 3}]}]}})
    assert differences(base, {"report": {"findings": []}})
    assert differences(base, {"report": {"findings": [{"evidence": [{"frame": 3}], "title": "t", "kind": 1}]}})
    stamped = ((100.0, 200.0), (300.0, 400.0))  # the windows the old and the new run read in
    assert differences({"ts": 150.0}, {"ts": 350.0}, windows=stamped) == []
    assert differences({"first_ts": 150.0}, {"first_ts": 350.0}, windows=stamped) == []
    assert differences({"ts": 50.0}, {"ts": 350.0}, windows=stamped)  # a time of the input, not a stamp
    assert differences({"ts": 150.0}, {"ts": 50.0}, windows=stamped)
