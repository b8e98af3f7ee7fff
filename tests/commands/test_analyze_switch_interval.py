"""analyze holds the GIL longer per turn while it makes a report (REPORT_SWITCH_INTERVAL_S), and gives the
interpreter's interval back afterwards, also when the run fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubectl_meshdoctor.cli import main
from kubectl_meshdoctor.commands import analyze

DATA = Path(__file__).resolve().parent.parent / "data"


def _recording(monkeypatch, seen: list, fail: bool = False):
    real = analyze.analyze_pods

    async def recording(*args, **kwargs):
        seen.append(sys.getswitchinterval())
        if fail:
            raise analyze.InputError("stop here")
        return await real(*args, **kwargs)

    monkeypatch.setattr(analyze, "analyze_pods", recording)


def test_the_report_is_made_at_the_longer_interval_and_the_old_one_comes_back(monkeypatch, capsys):
    seen: list = []
    _recording(monkeypatch, seen)
    before = sys.getswitchinterval()
    code = main(["analyze", str(DATA / "lab-collision-lo.pcap"), str(DATA / "lab-collision-eth0.pcap"), "-o", "json"])
    assert code in (0, 1) and '"findings"' in capsys.readouterr().out
    assert seen == [pytest.approx(analyze.REPORT_SWITCH_INTERVAL_S)] and before < analyze.REPORT_SWITCH_INTERVAL_S / 2
    assert sys.getswitchinterval() == before


def test_a_failed_run_gives_the_interval_back_too(monkeypatch, capsys):
    seen: list = []
    _recording(monkeypatch, seen, fail=True)
    before = sys.getswitchinterval()
    assert main(["analyze", str(DATA / "lab-collision-lo.pcap")]) == 2
    assert seen == [pytest.approx(analyze.REPORT_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before
