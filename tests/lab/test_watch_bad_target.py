"""Issue 32, item 3: on a terminal, a watch whose target the cluster does not have says so in one line and exits 2
before the screen opens (it used to open the TUI with the error on its status line, waiting for q, where a key
typed meanwhile wrote an empty report). The lab's API server stands in for the cluster; the program runs on a
real pseudo-terminal, as from a person's shell."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from .apiserver_lab import NAMESPACE, POD, Server, netns_name, server  # noqa: F401 (fixtures used by name)
from .terminal import Terminal

pytestmark = pytest.mark.lab

ALT_SCREEN = b"\x1b[?1049h"  # what Textual writes first when it takes the screen


@pytest.mark.parametrize("target, said", [
    (["pod/framin"], b'pod "framin" not found'),
    (["deploy/framin"], b"framin"),
    ([f"pod/{POD}", "pod/framin"], b'pod "framin" not found'),
    (["-l", "app=nothing-has-this"], b"app=nothing-has-this"),
])
def test_a_target_the_cluster_lacks_is_one_line_before_any_screen(server: Server, tmp_path: Path, target, said):
    env = dict(os.environ, TMPDIR=str(tmp_path), TERM="xterm-256color")
    term = Terminal.start([sys.executable, "-m", "kubectl_meshdoctor", "watch", *target, "-n", NAMESPACE,
                           "--kubeconfig", str(server.kubeconfig)], env, rows=24, cols=80)
    try:
        code = term.wait(60)
    finally:
        term.kill()
    lines = [line for line in term.out.replace(b"\r", b"").split(b"\n") if line.strip()]
    assert code == 2, term.out
    assert ALT_SCREEN not in term.out, term.out[:300]
    assert len(lines) == 1 and b"error:" in lines[0] and said in lines[0], lines
    assert not any(tmp_path.iterdir()) and not list(Path.cwd().glob("meshdoctor-report*")), "a file was written"
