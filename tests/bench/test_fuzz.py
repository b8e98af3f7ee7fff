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
