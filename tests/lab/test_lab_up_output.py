"""`lab up`'s own words: the pods it made and the watch commands to try (a new user reads nothing else)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .lab_names import lab_name

pytestmark = pytest.mark.lab


def test_lab_up_names_each_caller_pod_and_the_watch_of_each_pair(tmp_path):
    """A new-user trial and a breaker: `lab up --caller sidecar` listed `pods refused` without its caller pod, and
    with two scenarios printed the watch command of the first pair only."""
    name, state_dir = lab_name("up"), tmp_path / "lab"
    up = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lab", "up", "--name", name, "--state-dir",
                         str(state_dir), "--pods", "refused,downstream-idle", "--caller", "sidecar"],
                        capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        listed = next(line for line in up.stdout.splitlines() if " is up: pods " in line)
        assert all(p in listed for p in ("refused", "downstream-idle", "refused-caller", "downstream-idle-caller"))
        tries = [line for line in up.stdout.splitlines() if line.startswith("try:")]
        assert len(tries) == 2 and "watch pod/refused-caller pod/refused " in tries[0], tries
        assert "watch pod/downstream-idle-caller pod/downstream-idle " in tries[1], tries
    finally:
        subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lab", "down", "--state-dir", str(state_dir)],
                       capture_output=True, timeout=120)
