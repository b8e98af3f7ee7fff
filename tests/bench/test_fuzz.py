"""bench/fuzz: its mutations change the capture as they say, and a short seeded run counts nothing wrong."""

from __future__ import annotations

import importlib.util
import random
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _fuzz():
    spec = importlib.util.spec_from_file_location("bench_fuzz", ROOT / "bench" / "fuzz.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_mutation_changes_the_capture_and_is_seeded():
    fuzz = _fuzz()
    seen = set()
    for name in fuzz.INPUTS:
        data = (DATA / name).read_bytes()
        for seed in range(40):
            kind, out = fuzz.mutate(data, name.endswith(".pcapng"), random.Random(seed))
            assert out != data or kind == "duplicate", kind
            assert fuzz.mutate(data, name.endswith(".pcapng"), random.Random(seed)) == (kind, out)
            seen.add(kind)
    assert seen == {"flip", "truncate", "duplicate", "block-length", "record-lengths", "tcp-offset"}


@pytest.mark.skipif(shutil.which("tshark") is None, reason="analyze reads captures through tshark")
def test_a_short_run_finds_nothing_wrong(capsys):
    assert _fuzz().main(["--count", "12", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "12 cases" in out and "internal errors: 0" in out and "leftover files: 0" in out


@pytest.mark.parametrize("kind", ["log", "stats", "clusters"])
def test_a_short_run_of_each_text_kind_counts_every_bad_thing(kind, capsys, tmp_path):
    """Issue 29: four cases of a kind run, each counted for every bad thing, the peak RSS printed; --no-redact's
    markers would be caught (a planted secret is in the input)."""
    fuzz = _fuzz()
    cases = list(fuzz.make_cases(4, 11, (kind,)))
    assert {c["kind"] for c in cases} == {kind} and all(c["data"] for c in cases)
    if kind == "log":
        assert any(c["markers"] and c["markers"][0].encode() in c["data"] or c["data"][:2] == b"\x1f\x8b"
                   for c in cases)
    assert fuzz.main(["--count", "4", "--seed", "11", "--kinds", kind, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    for what in fuzz.BAD:
        assert f"{what}: 0" in out, (what, out)
    assert "4 cases" in out and "peak RSS: " in out


def test_a_secret_or_a_control_byte_in_the_output_is_counted(tmp_path):
    """The counters can fail: a marker the product prints (with --no-redact it would) and an ESC on stderr."""
    fuzz = _fuzz()
    seen = fuzz.CONTROL.findall("ok\x1b[2J \u202e \x9b \udc9b\t\n")
    assert seen == ["\x1b", "\u202e", "\x9b", "\udc9b"]
    assert fuzz._nothing_read({"stats": {"packets": 0, "frames_read": {}}, "envoy": {"access_log_lines": 0}})
    assert not fuzz._nothing_read({"stats": {"packets": 0}, "envoy": {"clusters": {"x": {}}}})


def test_the_tui_pass_drives_every_pane(tmp_path):
    """One hostile-text case: the app stays up over every pane and returns its report."""
    fuzz = _fuzz()
    sys.path.insert(0, str(ROOT / "bench"))
    import fuzz_tui

    r = fuzz_tui.run_case(0, 5)
    assert r["exception"] is None and r["problems"] == [], r
    assert "secrets_shown" in r and "control_bytes" in r and fuzz.CONTROL
