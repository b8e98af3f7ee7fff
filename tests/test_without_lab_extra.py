"""`pip install .` (no extra) gives watch, analyze, lint and log-level; only the lab needs the
`lab` extra (real Envoy's wheel, aiohttp, psutil, h2). Each command runs here in a Python that cannot import those
three, as on a machine where they were never installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
LAB_EXTRA = ("envoy", "aiohttp", "psutil", "h2")  # the top-level modules of the lab extra's packages

RUN_WITHOUT = f"""
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {LAB_EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from kubectl_meshdoctor.cli import main
sys.exit(main(sys.argv[1:]))
"""


def meshdoctor(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    return subprocess.run([sys.executable, "-c", RUN_WITHOUT, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)


def test_the_blocker_blocks(tmp_path):
    proc = subprocess.run([sys.executable, "-c", RUN_WITHOUT.replace("from kubectl_meshdoctor.cli import main\n"
                                                                     "sys.exit(main(sys.argv[1:]))", "import psutil")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "No module named 'psutil'" in proc.stderr


def test_analyze_runs_without_the_lab_extra(tmp_path):
    proc = meshdoctor("analyze", f"{DATA / 'lab-collision-eth0.pcap'}:eth0", "-o", "json", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr  # 1: the capture holds an error finding
    assert '"detector": "tuple-collision"' in proc.stdout


@pytest.mark.parametrize("command", [["watch", "pod/x"], ["lint", "pod/x"], ["log-level", "pod/x"]])
def test_cluster_commands_get_as_far_as_the_cluster_without_the_lab_extra(tmp_path, command):
    """No kubeconfig here: each command imports everything it needs and stops at the cluster, in one line."""
    proc = meshdoctor(*command, tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "kubeconfig" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


def test_lab_up_says_in_one_line_what_to_install(tmp_path):
    proc = meshdoctor("lab", "up", "--state-dir", str(tmp_path / "lab"), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == ("kubectl meshdoctor: error: the lab needs the lab extra (no module psutil): from the "
                           "repository, pip install '.[lab]' (or scripts/install)\n")
    assert not (tmp_path / "lab").exists()
