"""scripts/demo as a new user met it: its exit code, a TUI drawn on a stderr that is no terminal, and the "try:"
commands lab up prints, which stop working when the demo takes the lab down.

The real script runs in a copy of the repository's layout whose scripts/install and .venv/bin/kubectl-meshdoctor
are stand-ins (installing with apt and bringing a lab up are not what these tests look at): the stand-in records
its arguments, prints what `lab up` prints, and exits as watch would."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = Path("/run/kubectl-meshdoctor/meshdoctor-lab/state.json")

STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls"
case "$1" in
  lab) if [ "$2" = up ]; then
         echo "lab meshdoctor-lab is up: pods collision, healthy in namespace meshdoctor-lab"
         echo "try:  kubectl meshdoctor watch pod/collision --kubeconfig /run/x/kubeconfig"
       fi ;;
  watch) exit "${WATCH_EXIT:-0}" ;;
esac
"""


@pytest.fixture
def demo(tmp_path):
    if STATE.exists():
        pytest.skip("a lab named meshdoctor-lab is up on this machine: the demo refuses to start beside it")
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "demo", tmp_path / "scripts" / "demo")
    (tmp_path / "scripts" / "install").write_text("#!/usr/bin/env bash\nexit 0\n")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "kubectl-meshdoctor").write_text(STAND_IN)
    for f in (tmp_path / "scripts" / "install", bin_dir / "kubectl-meshdoctor"):
        f.chmod(0o755)
    return tmp_path


def _calls(root: Path) -> list[str]:
    path = root / ".venv" / "bin" / "calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("watch_exit", [0, 1, 2])
def test_the_demo_exits_with_watchs_code(demo, watch_exit):
    proc = subprocess.run([str(demo / "scripts" / "demo"), "--no-tui"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "WATCH_EXIT": str(watch_exit)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == watch_exit, proc.stderr
    assert _calls(demo)[-1] == "lab down"  # taken down whatever watch said


def test_try_commands_say_they_need_the_demo_running(demo):
    proc = subprocess.run([str(demo / "scripts" / "demo"), "--no-tui"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert "\ntry:" not in "\n" + proc.stderr
    assert "while the demo runs, in another terminal: kubectl meshdoctor watch pod/collision" in proc.stderr
    assert "the lab is taken down (the commands above need it" in proc.stderr
    assert proc.stdout == ""  # stdout is watch's report alone


def test_a_tui_on_a_stderr_that_is_no_terminal_is_refused_in_one_line(demo, tmp_path):
    main, sub = pty.openpty()
    err = tmp_path / "err.txt"
    try:
        with open(err, "w") as e:
            proc = subprocess.run([str(demo / "scripts" / "demo")], stdin=sub, stdout=sub, stderr=e, timeout=60)
    finally:
        os.close(sub)
        os.close(main)
    said = err.read_text()
    assert proc.returncode == 2 and said.count("\n") == 1 and "TUI draws on stderr" in said, said
    assert _calls(demo) == []  # refused before anything was installed or brought up
