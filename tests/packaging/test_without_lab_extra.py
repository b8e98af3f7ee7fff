"""`pip install .` gives watch, analyze, lint and log-level; the pod lab is a distribution of its own (lab/:
real Envoy's wheel, psutil, h2 come with it; aiohttp too, but the product needs it as well, for the live
capture's exec websocket). Each command runs here in a Python that cannot import those,
as on a machine where they were never installed; `lab` also where the lab itself is not installed, or broken."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"
LAB_EXTRA = ("envoy", "psutil", "h2")  # the top-level modules of the lab's dependencies the product does without
LAB = "meshdoctor_lab"

RUN_WITHOUT = """
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
if NO_LAB_DISTRIBUTION:  # as where kubectl-meshdoctor-lab was never installed: its entry points are not there
    import importlib.metadata as metadata
    every = metadata.entry_points
    metadata.entry_points = lambda **kw: metadata.EntryPoints(
        ep for ep in every(**kw) if not ep.value.startswith("meshdoctor_lab"))
from kubectl_meshdoctor.cli import main
sys.exit(main(sys.argv[1:]))
"""


def meshdoctor(*args: str, tmp_path: Path, blocked: tuple[str, ...] = LAB_EXTRA,
               lab_installed: bool = True) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    script = f"BLOCKED = {blocked!r}\nNO_LAB_DISTRIBUTION = {not lab_installed!r}\n" + RUN_WITHOUT
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)


def test_the_blocker_blocks(tmp_path):
    script = f"BLOCKED = {LAB_EXTRA!r}\nNO_LAB_DISTRIBUTION = True\n" + RUN_WITHOUT.replace(
        "from kubectl_meshdoctor.cli import main\nsys.exit(main(sys.argv[1:]))",
        "from kubectl_meshdoctor.commands.extensions import load_extensions\n"
        "assert 'lab' not in load_extensions(frozenset())\nimport psutil")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "No module named 'psutil'" in proc.stderr, proc.stderr


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
    """The lab installed, one of its dependencies not."""
    proc = meshdoctor("lab", "up", "--state-dir", str(tmp_path / "lab"), tmp_path=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == ("kubectl meshdoctor: error: the lab cannot run without the module psutil: from the "
                           "repository, pip install ./lab (or scripts/install)\n")
    assert not (tmp_path / "lab").exists()


def test_without_the_lab_installed_lab_says_where_it_is(tmp_path):
    proc = meshdoctor("lab", "up", "--state-dir", str(tmp_path / "lab"), tmp_path=tmp_path,
                      blocked=(*LAB_EXTRA, LAB), lab_installed=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("kubectl meshdoctor: error: lab: the pod lab is a distribution of its own: from the "
                           "repository, pip install ./lab (or run scripts/install)\n")
    assert not (tmp_path / "lab").exists()
    listed = meshdoctor("--help", tmp_path=tmp_path, blocked=(*LAB_EXTRA, LAB), lab_installed=False)
    assert listed.returncode == 0 and "analyze" in listed.stdout and "\n    lab " not in listed.stdout
    with_lab = meshdoctor("--help", tmp_path=tmp_path)
    assert "\n    lab " in with_lab.stdout  # the same check sees the lab where it is installed


def test_a_lab_that_fails_to_load_takes_no_other_command_down(tmp_path):
    """The lab's distribution installed (its entry point), its package not importable."""
    proc = meshdoctor("lab", "up", "--pods", "collision", tmp_path=tmp_path, blocked=(*LAB_EXTRA, LAB))
    assert proc.returncode == 2
    assert proc.stderr == ("kubectl meshdoctor: error: command lab (meshdoctor_lab.command) failed to load: No module "
                           "named 'meshdoctor_lab'\n")
    proc = meshdoctor("analyze", f"{DATA / 'lab-collision-eth0.pcap'}:eth0", "-o", "json", tmp_path=tmp_path,
                      blocked=(*LAB_EXTRA, LAB))
    assert proc.returncode == 1 and '"detector": "tuple-collision"' in proc.stdout, proc.stderr
