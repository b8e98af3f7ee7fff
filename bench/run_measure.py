"""How bench/run measures a command: wall time, CPU time and peak memory of its whole process tree.

Split from run.py (issue 34 added the CPU time and the mixes; run.py would have passed 500 lines).
CPU time is the user + system time the kernel accounts to the commands and every descendant they waited for
(``getrusage(RUSAGE_CHILDREN)`` before and after: analyze waits for its tshark, so tshark's CPU is in analyze's).
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gen_tcp import FILES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TSHARK_FIELDS = ("frame.number", "frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport",
                 "tcp.dstport", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw", "tcp.len", "tcp.payload")
POLL_S = 0.05


def _mem(procs: list[psutil.Process]) -> tuple[int, int, int]:
    """(summed RSS, RSS with shared pages once, summed PSS) of ``procs`` and their children, in bytes. Shared
    pages once: every process's unique set plus the largest shared set (they run the same few binaries)."""
    rss = uss = pss = shared = 0
    everyone = []
    for proc in procs:
        try:
            everyone += [proc] + proc.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for p in everyone:
        try:
            m = p.memory_full_info()  # USS and PSS from /proc/PID/smaps_rollup
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += m.rss
        uss += m.uss
        pss += m.pss
        shared = max(shared, m.rss - m.uss)
    return rss, uss + shared, pss


def measure(cmds: list[list[str]], stdouts: list, cwd: Path | None = None) -> dict:
    """Start every command at once and wait for all; wall time from the first start to the last exit, CPU time
    (user + system, s) of every process tree, peak of the summed RSS of every process tree (sampled every
    POLL_S), exit codes and stderr tails. The caller must have no other child running (the CPU time is the
    difference of RUSAGE_CHILDREN around the run)."""
    errs = [tempfile.TemporaryFile() for _ in cmds]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=o, stderr=e, cwd=cwd) for c, o, e in zip(cmds, stdouts, errs)]
    ps = [psutil.Process(p.pid) for p in procs]
    peak = peak_once = peak_pss = 0
    samples = 0
    try:
        while True:
            running = [pp for p, pp in zip(procs, ps) if p.poll() is None]
            if not running:
                break
            rss, once, pss = _mem(running)
            peak, peak_once, peak_pss = max(peak, rss), max(peak_once, once), max(peak_pss, pss)
            samples += 1
            time.sleep(POLL_S)
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raise
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tails = []
    for e in errs:
        e.seek(0)
        tails.append(e.read()[-2000:].decode(errors="replace").strip())
        e.close()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_bytes": peak, "peak_once_bytes": peak_once, "peak_pss_bytes": peak_pss,
            "samples": samples,
            "exit_codes": [p.returncode for p in procs],
            "stderr": tails}


def _warm(paths: list[Path]) -> None:
    """Read the files once so neither run pays for the disk."""
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(1 << 22):
                pass


def analyze_exe() -> list[str]:
    venv = ROOT / ".venv" / "bin" / "kubectl-meshdoctor"
    if venv.exists():
        return [str(venv)]
    found = shutil.which("kubectl-meshdoctor")
    if found:
        return [found]
    return [sys.executable, "-m", "kubectl_meshdoctor"]


def run_analyze(d: Path, exe: list[str] | None = None) -> tuple[dict, dict]:
    """Run analyze on the pair in ``d``; returns (measurement, parsed report)."""
    with tempfile.TemporaryFile() as out:
        m = measure([(exe or analyze_exe()) + ["analyze", str(d / "eth0.pcap"), str(d / "lo.pcap"), "-o", "json"]],
                    [out])
        out.seek(0)
        raw = out.read()
    code = m["exit_codes"][0]
    if code not in (0, 1):  # 1: error findings, as the planted failures are
        raise RuntimeError(f"analyze exited {code}: {m['stderr'][0][-500:]}")
    try:
        report = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"analyze printed no JSON report ({e}); stderr: {m['stderr'][0][-500:]}") from None
    return m, report


def run_tshark(d: Path) -> dict:
    cmds = []
    for f in FILES.values():
        cmd = ["tshark", "-r", str(d / f), "-n", "-T", "fields"]
        for field in TSHARK_FIELDS:
            cmd += ["-e", field]
        cmds.append(cmd)
    m = measure(cmds, [subprocess.DEVNULL] * len(cmds))
    if any(m["exit_codes"]):
        raise RuntimeError(f"tshark exited {m['exit_codes']}: {' | '.join(m['stderr'])[-500:]}")
    return m
