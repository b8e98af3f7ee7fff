"""A capture of one of a pod's two interfaces: the report says what only the other one shows (core/unseen.py),
in text, markdown and json, and keeps the exit code of what it found (README: 0 no error finding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kubectl_meshdoctor.core.detector import DetectorContext
from kubectl_meshdoctor.core.flows import FlowTable
from kubectl_meshdoctor.core.registry import load_detectors
from kubectl_meshdoctor.core.unseen import missed_by, unseen

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *args], capture_output=True,
                          text=True, timeout=120)


def test_lo_alone_says_eth0s_classes_could_not_show():
    lo = os.path.join(DATA, "lab-collision-lo.pcap")
    text = _analyze(lo)
    assert text.returncode == 0, text.stderr  # no error finding: exit 0, as documented
    assert "verdict: no failure seen" in text.stdout
    said = text.stdout.split("not seen: ", 1)[1].split("\nno findings")[0]
    assert "lo only (no eth0 packet)" in said and "challenge ACK" in said and "give eth0 too" in said
    report = json.loads(_analyze(lo, "-o", "json").stdout)
    (u,) = report["not_seen"]
    assert u["missing"] == "eth0" and "tuple-collision" in [c["detector"] for c in u["classes"]]
    assert "> not seen: lo only" in _analyze(lo, "-o", "markdown").stdout


def test_eth0_alone_says_los_and_both_say_nothing():
    eth0 = os.path.join(DATA, "lab-collision-eth0.pcap")
    (u,) = json.loads(_analyze(eth0, "-o", "json").stdout)["not_seen"]
    assert u["missing"] == "lo" and "upstream-refused" in [c["detector"] for c in u["classes"]]
    both = json.loads(_analyze(eth0, os.path.join(DATA, "lab-collision-lo.pcap"), "-o", "json").stdout)
    assert "not_seen" not in both


@pytest.mark.parametrize("by_iface, want", [
    ({"lo": 3}, [(None, "eth0")]),
    ({"eth0": 3, "lo": 0}, [(None, "lo")]),
    ({"lo": 3, "eth0": 1}, []),
    ({"a/lo": 2, "a/eth0": 2, "b/eth0": 5}, [("b", "lo")]),
    ({"any": 9}, []),
])
def test_unseen_by_pod(by_iface, want):
    loaded = load_detectors(DetectorContext(flows=FlowTable()))
    missed = missed_by((d.id, d.unseen_rank, d.unseen_without) for d in loaded)
    got = unseen(by_iface, missed)
    assert [(u.pod, u.missing) for u in got] == want
    for u in got:
        assert u.classes == tuple((m.detector, m.what) for m in missed if m.iface == u.missing) and u.classes
