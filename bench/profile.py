#!/usr/bin/env python3
"""Where analyze's CPU goes on one of bench/gen's mixes (issue 34: "find where the CPU goes, before and after
each step").

    bench/profile.py [--mix short] [--packets 1000000] [--seed 1] [--rate 100] [--top 25] [--raw FILE]

Runs ``kubectl-meshdoctor analyze`` once on the cached capture pair of bench/run (generated on first use) under
py-spy (``pip install py-spy``; sampling ``--rate`` times a second, ``--nonblocking`` so the process is not
paused) and, at the same time, reads the analyze process's CPU times from the kernel every 20 ms: its own (the
Python process: reading tshark's lines, the pre-pass, the detectors) and its waited-for children's (tshark). It
prints both, then the functions with the most samples: by their own samples (where the CPU is spent) and by the
samples they are on the stack for (inclusive), both as shares of the Python process's samples. Without py-spy it
uses cProfile instead (slower: it traces every call; its shares are of the profiled time).

py-spy samples only Python threads (tshark is a separate, native process: that is the children's CPU time), and
samples a thread only while it is not idle, so its shares are of the Python process's busy time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402  (bench/run.py: the capture cache)
from run_measure import analyze_exe  # noqa: E402


_LIB = re.compile(r"^.*/(site-packages|lib/python3\.\d+)/")  # where a library's module path starts
OURS = ("kubectl_meshdoctor/", "plugins/", "pyshark/")  # the inclusive list: our code and pyshark's, not asyncio's


def _py_spy() -> str | None:
    near = Path(sys.executable).with_name("py-spy")
    return str(near) if near.exists() else shutil.which("py-spy")


def _function(frame: str) -> str:
    """``name (path:line)`` as py-spy prints a frame, without the line: samples add up per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    return f"{name} ({_LIB.sub('', path)})"


def top_functions(raw: Path, top: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """From py-spy's raw (collapsed stacks) output: (samples, most own samples, most inclusive samples)."""
    own: Counter = Counter()
    inclusive: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        names = [_function(f) for f in frames]
        own[names[-1]] += n
        for name in set(names):
            if any(part in name for part in OURS):
                inclusive[name] += n
    return total, own.most_common(top), inclusive.most_common(top)


def _watch(proc: subprocess.Popen, analyze_name: str) -> dict:
    """Poll until ``proc`` exits; the last CPU times seen of the analyze process (``proc`` or its child)."""
    last: dict = {}
    while proc.poll() is None:
        try:
            root = psutil.Process(proc.pid)
            tree = [root] + root.children(recursive=True)
            target = next((p for p in tree if analyze_name in " ".join(p.cmdline()[:3])), None)
            if target is not None:
                t = target.cpu_times()
                tsharks = [c for c in target.children(recursive=True) if c.name() == "tshark"]
                last = {"python_s": t.user + t.system, "children_s": t.children_user + t.children_system,
                        "tshark_running_s": sum(sum(c.cpu_times()[:2]) for c in tsharks)}
        except (psutil.NoSuchProcess, psutil.AccessDenied, StopIteration):
            pass
        time.sleep(0.02)
    return last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/profile.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mix", default="short", choices=run.gen.MIXES)
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples a second (default 100)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--waiting", action="store_true",
                    help="sample every busy thread, also one waiting for the GIL (counted where it waits); by "
                         "default only the thread holding the GIL is sampled: the shares are then of the CPU "
                         "the Python code uses (analyze's reader, pass and merger threads share one GIL)")
    ap.add_argument("--raw", help="keep py-spy's raw output (collapsed stacks) in this file")
    ap.add_argument("--cache", default=str(HERE / ".cache"))
    a = ap.parse_args(argv)
    d = run.capture_dir(Path(a.cache), a.packets, a.seed, a.mix)
    exe = analyze_exe()
    cmd = exe + ["analyze", str(d / "eth0.pcap"), str(d / "lo.pcap"), "-o", "json"]
    spy = _py_spy()
    out = Path(a.raw) if a.raw else Path(tempfile.mkstemp(suffix=".raw" if spy else ".prof")[1])
    if spy:
        cmd = [spy, "record", "-r", str(a.rate), "--nonblocking", *([] if a.waiting else ["--gil"]),
               "-f", "raw", "-o", str(out), "--"] + cmd
    else:
        target = ["-m", "kubectl_meshdoctor"] if exe[-1] == "kubectl_meshdoctor" else [exe[-1]]
        cmd = [sys.executable, "-m", "cProfile", "-o", str(out)] + target + cmd[len(exe):]
    started = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(cmd, stdout=null, stderr=subprocess.PIPE)
        cpu = _watch(proc, "kubectl-meshdoctor" if exe[0].endswith("kubectl-meshdoctor") else exe[0])
        err = proc.stderr.read().decode(errors="replace")
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        print(f"bench/profile: analyze exited {proc.returncode}: {err[-800:]}", file=sys.stderr)
        return 2
    print(f"{a.mix}, {a.packets} packets (seed {a.seed}), {'py-spy' if spy else 'cProfile'}: wall {wall:.1f} s")
    if cpu:
        print(f"CPU: analyze's Python process {cpu['python_s']:.1f} s, its tshark children "
              f"{cpu['children_s'] + cpu['tshark_running_s']:.1f} s (as last seen, every 20 ms)")
    if not spy:
        import pstats
        pstats.Stats(str(out)).sort_stats("tottime").print_stats(a.top)
        return 0
    total, own, inclusive = top_functions(out, a.top)
    print(f"py-spy: {total} samples of the Python process's " +
          ("busy threads" if a.waiting else "thread holding the GIL"))
    for title, rows in (("own samples (where the CPU is spent)", own), ("inclusive (on the stack; ours and pyshark's)", inclusive)):
        print(title + ":")
        for name, n in rows:
            print(f"  {100 * n / total:5.1f}%  {name}")
    if not a.raw:
        out.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
