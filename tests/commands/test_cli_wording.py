"""What a new user met at the command line (issue s44): words that said something else than what happened."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys

from kubectl_meshdoctor.commands import console
from kubectl_meshdoctor.core.pipeline import Pipeline

from ..waiting import wait_until_async

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", *args], capture_output=True,
                          text=True, timeout=120)


def test_an_empty_file_is_called_empty(tmp_path):
    empty = tmp_path / "lo.pcap"
    empty.write_bytes(b"")
    alone = _analyze(str(empty))
    assert alone.returncode == 2 and alone.stderr.strip().endswith("lo.pcap: empty (0 bytes): nothing to read")
    beside = _analyze(str(empty), os.path.join(DATA, "lab-collision-eth0.pcap"))
    assert f"problem: {empty}: empty (0 bytes): nothing to read" in beside.stdout
    assert "not a capture" not in beside.stdout + alone.stderr


def test_a_packets_only_finding_says_what_envoy_would_log():
    packets = _analyze(os.path.join(DATA, "lab-collision-eth0.pcap")).stdout
    assert "\n  envoy: " not in packets
    assert "  envoy would log: upstream_reset_before_response_started{connection_termination}" in packets
    assert "(flag UC/UF/URX), no log line of it" in packets and "no Envoy log read" not in packets


def test_a_log_backed_finding_says_what_envoy_logged():
    server = os.path.join(DATA, "envoy-1.40-mesh", "stale-keepalive", "server")
    text = _analyze(os.path.join(server, "istio-proxy.log")).stdout
    assert "  envoy logged: upstream_reset_before_response_started{connection_termination}" in text


def test_a_refusal_of_unknown_cause_says_what_is_missing():
    text = _analyze(os.path.join(DATA, "envoy-1.40-mesh", "refused", "server", "lo.pcap")).stdout
    assert "not in this evidence" not in text
    assert "connection refused (cause unknown without the pod's listening sockets and restarts" in text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_says_its_count_is_so_far(monkeypatch):
    """The line is a snapshot while packets are still on their way; the report's headline is the total."""
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)

    async def run() -> None:
        task = asyncio.create_task(console.progress_line([Pipeline.with_detectors()], "analyzing", every_s=0.01))
        await wait_until_async("a progress line counting packets", 10, err.getvalue, ok=lambda text: "packets" in text)
        task.cancel()

    asyncio.run(run())
    assert "analyzing, so far: 0 packets analysed" in err.getvalue()
