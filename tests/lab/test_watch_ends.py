"""However a TUI watch ends, its capture bytes do not outlive it: the spool (the private copy `s` saves from) is
removed on SIGTERM, SIGHUP and a closed terminal as on `q`; after a SIGKILL, which leaves no time to, the next
run removes it; no helper process of ours outlives it by more than 5 s, and tcpdump ends in the pod."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from meshdoctor_lab import lab

from ..waiting import wait_until
from .terminal import Terminal
from .test_watch import tcpdumps_in
from .lab_names import lab_name

pytestmark = pytest.mark.lab

POD = "healthy-http"


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    name = lab_name("e")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, (POD,), drivers=False)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def spools(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(".meshdoctor-spool-*"))


def _spooled(tmp: Path) -> bool:
    """Both interfaces' spool files hold packets (more than a pcap file header of 24 bytes)."""
    files = [f for d in spools(tmp) for f in d.glob("*.pcap")]
    return len(files) == 2 and all(f.stat().st_size > 24 for f in files)


def start_tui(state, tmp: Path) -> Terminal:
    """``watch pod/healthy-http`` on a terminal of its own, its TMPDIR ``tmp``, once both interfaces' packets
    reach its spool (lab rounds run until they do) and its tshark has started (it starts once the first stream's
    header is in, after a version check: later than the spool's first bytes on a busy machine)."""
    env = dict(os.environ, TMPDIR=str(tmp), TERM="xterm-256color")
    term = Terminal.start([sys.executable, "-m", "kubectl_meshdoctor", "watch", f"pod/{POD}", "--kubeconfig",
                           str(state.kubeconfig)], env)
    try:
        term.drain_until("both tcpdumps listening", 60, lambda: len(tcpdumps_in(state.pod(POD).netns)) == 2)

        def traffic_spooled() -> bool:
            if not _spooled(tmp):
                lab.trigger_round(state, POD)
            return _spooled(tmp)

        term.drain_until("packets in the spool", 60, traffic_spooled)
        term.drain_until("tshark started", 60, lambda: any(h.name() == "tshark" for h in helpers_of(term.pid)))
    except BaseException:
        term.kill()
        raise
    return term


def helpers_of(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "closed terminal"])
def test_a_signalled_tui_watch_stops_cleanly_and_removes_its_spool(lab_state, tmp_path, how):
    term = start_tui(lab_state, tmp_path)
    try:
        (spool,) = spools(tmp_path)
        assert spool.stat().st_mode & 0o777 == 0o700
        helpers = helpers_of(term.pid)
        if how == "closed terminal":
            term.hang_up()
            code = term.wait_closed(60)
        else:
            os.kill(term.pid, getattr(signal, how))
            code = term.wait(60)
            # Stopped as `q` stops: the report is printed where the screen was.
            assert b"packets analysed" in term.out, term.out[-500:]
        assert code in (0, 1), f"exit {code}"
    finally:
        term.kill()
    assert not spool.exists()
    _, alive = psutil.wait_procs(helpers, timeout=5)
    assert not alive, alive
    wait_until("tcpdump ended in the pod", 10, lambda: not tcpdumps_in(lab_state.pod(POD).netns))


def test_a_sigkilled_tui_watch_leaves_nothing_after_the_next_run_starts(lab_state, tmp_path):
    term = start_tui(lab_state, tmp_path)
    helpers = helpers_of(term.pid)
    (spool,) = spools(tmp_path)
    term.kill()
    _, alive = psutil.wait_procs(helpers, timeout=5)
    assert not alive, alive
    assert spool.exists()  # nothing of ours lived to remove it: the next run must
    # Another user's (here: a live process's) spool is left alone.
    live = tmp_path / f".meshdoctor-spool-{os.getpid()}-kept"
    live.mkdir(mode=0o700)
    nxt = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "watch", f"pod/{POD}", "--kubeconfig",
                          str(lab_state.kubeconfig), "--no-tui", "--duration", "1", "-o", "json"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert nxt.returncode in (0, 1), nxt.stderr
    assert not spool.exists() and live.exists()
    wait_until("tcpdump ended in the pod", 10, lambda: not tcpdumps_in(lab_state.pod(POD).netns))
