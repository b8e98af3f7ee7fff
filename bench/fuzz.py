"""bench/fuzz: `analyze` against broken inputs of every kind, counted (issues 15 and 29).

Each case is one seed of one kind (--kinds), in one shape, with one mutation from a seeded random source:
- ``capture``: the repository's real captures (bench/fuzz_capture.py: bits flipped, cut short, record or block
  lengths changed, a TCP header length below 20, records duplicated), gzipped one time in four;
- ``log``, ``stats``, ``clusters``: the repository's real Envoy logs and admin dumps (bench/fuzz_inputs.py: every
  shape Envoy and Istio print a log in, Istio's JSON access log, the wrappers people paste), with secrets planted
  where the product promises to hide them, then mutated (bench/fuzz_mutate.py: bit flips, hostile bytes spliced
  in, cuts, duplicated lines, huge lines, absurd counters, gzip cut short or with a bad CRC, gzip bombs).
Each runs as a user runs it (`python -m kubectl_meshdoctor analyze FILE -o json`; every third case `-o text`,
every third `-o markdown`) in a directory and a session of its own, and is counted bad for: an internal error or
traceback, a hang (past --timeout), an exit code outside 0/1/2, JSON that does not parse, files left beside the
input, processes left in its session, a planted secret's marker on stdout or stderr, a control byte (C0 but
LF and TAB, DEL, C1, U+202A-202E, U+2066-2069, or an undecodable byte) on stderr or on the stdout of text and
markdown, a JSON report that read nothing (no frame, log line, counter or cluster) exiting 0, and a peak RSS
(the child's getrusage maximum, tshark included) over --max-rss-mb. The run prints the highest peak RSS.
--tui N then drives the TUI over N hostile-text cases, --jobs at once (bench/fuzz_tui.py).
Exit 0 when nothing went wrong, else 1.

    bench/fuzz --count 200 --seed 1 [--kinds capture,log,stats,clusters] [--timeout 60] [--jobs 2]
               [--max-rss-mb 1536] [--tui 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_capture import INPUTS, mutate  # noqa: E402,F401 (mutate: tests/bench/test_fuzz.py)
from fuzz_inputs import KINDS, pick, seeds, shaped  # noqa: E402
from fuzz_mutate import CONTROL, mutate_text  # noqa: E402,F401 (CONTROL: tests/bench/test_fuzz.py)

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = ("json", "text", "markdown")
ALL_KINDS = ("capture", *KINDS)
# Runs the product and writes its peak RSS (the largest of it and its children, tshark included) to argv[1].
WRAP = ("import resource, subprocess, sys\n"
        "r = subprocess.call(sys.argv[2:])\n"
        "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
        "sys.exit(128 - r if r < 0 else r)\n")
BAD = ("internal errors", "hangs", "exit codes outside 0/1/2", "invalid JSON", "leftover processes",
       "leftover files", "secrets shown", "control bytes", "exit 0 with nothing read", "over the RSS bound")


def _session(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != sid and os.getsid(p.pid) == sid:
                out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


def _nothing_read(report: dict) -> bool:
    envoy = report.get("envoy") or {}
    stats = report.get("stats") or {}
    # One file can be several pods' (a `kubectl logs --prefix` log names each line's pod): each pod's side apart.
    sides = list((envoy.get("per_pod") or {}).values()) or [envoy]
    return not (stats.get("packets") or any((stats.get("frames_read") or {}).values())
                or any(side.get("access_log_lines") or side.get("component_log_entries")
                       or side.get("counters_moved") or side.get("clusters") for side in sides))


def run_case(case: dict, timeout: float, max_rss_mb: float) -> dict:
    """Run analyze on one mutated input in a directory of its own; what happened."""
    n, name, data, markers = case["case"], case["input"], case["data"], case["markers"]
    work = Path(tempfile.mkdtemp(prefix=f"meshdoctor-fuzz-{n}-"))
    rss_file = Path(tempfile.mkstemp(prefix=f"meshdoctor-fuzz-rss-{n}-")[1])
    try:
        target = work / (name + (".gz" if data[:2] == b"\x1f\x8b" else ""))
        target.write_bytes(data)
        # Every third case renders text, every third markdown: their renderers meet the same odd inputs.
        output = OUTPUTS[n % len(OUTPUTS)]
        proc = subprocess.Popen([sys.executable, "-c", WRAP, str(rss_file), sys.executable, "-m",
                                 "kubectl_meshdoctor", "analyze", str(target), "-o", output],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work, start_new_session=True)
        t0 = time.monotonic()
        try:
            out_b, err_b = proc.communicate(timeout=timeout)
            hang = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session and group, started here
            out_b, err_b = proc.communicate()
            hang = True
        seconds = time.monotonic() - t0
        out, err = out_b.decode("utf-8", "surrogateescape"), err_b.decode("utf-8", "surrogateescape")
        rss_text = rss_file.read_text().strip()
        rss_mb = round(int(rss_text) / 1024, 1) if rss_text else None
        r = {k: case[k] for k in ("case", "kind", "input", "shape", "mutation")}
        r.update({"output": output, "bytes": len(data), "exit": proc.returncode, "hang": hang,
                  "seconds": round(seconds, 2), "rss_mb": rss_mb})
        r["internal_error"] = "internal error" in err or "Traceback" in err
        r["bad_exit"] = not hang and proc.returncode not in (0, 1, 2)
        r["invalid_json"] = r["nothing_read_exit_0"] = False
        if proc.returncode in (0, 1) and output == "json":
            try:
                report = json.loads(out)
                r["nothing_read_exit_0"] = proc.returncode == 0 and _nothing_read(report)
            except ValueError:
                r["invalid_json"] = True
        r["secrets_shown"] = [m for m in markers if m in out or m in err]
        shown = err + (out if output != "json" else "")
        r["control_bytes"] = sorted({f"U+{ord(c):04X}" for c in CONTROL.findall(shown)})
        r["over_rss"] = rss_mb is not None and rss_mb > max_rss_mb
        left = _session(proc.pid)
        r["leftover_processes"] = [p.pid for p in left]
        for p in left:
            p.kill()
        r["leftover_files"] = sorted(p.name for p in work.iterdir() if p != target)
        if r["internal_error"] or r["bad_exit"] or r["control_bytes"]:
            r["stderr"] = err.strip().splitlines()[-3:]
        return r
    finally:
        shutil.rmtree(work, ignore_errors=True)
        rss_file.unlink(missing_ok=True)


def bad(r: dict) -> bool:
    return bool(r["internal_error"] or r["bad_exit"] or r["hang"] or r["invalid_json"] or r["leftover_processes"]
                or r["leftover_files"] or r["secrets_shown"] or r["control_bytes"] or r["nothing_read_exit_0"]
                or r["over_rss"])


def make_cases(count: int, seed: int, kinds: tuple[str, ...]):
    """The cases of a run, one at a time (a bomb's bytes are held only while its case runs)."""
    rnd = random.Random(seed)
    captures = {name: (ROOT / "tests" / "data" / name).read_bytes() for name in INPUTS}
    texts = seeds()
    for n in range(count):
        kind = rnd.choice(kinds)
        if kind == "capture":
            name = rnd.choice(INPUTS)
            mutation, data = mutate(captures[name], name.endswith(".pcapng"), rnd)
            if rnd.random() < 0.25:
                import gzip

                mutation, data = mutation + "+gzip", gzip.compress(data, mtime=0)
            yield {"case": n, "kind": kind, "input": name, "shape": "as-read", "mutation": mutation, "data": data,
                   "markers": []}
            continue
        name, lines = rnd.choice(texts[kind])
        shape = pick(kind, rnd)
        lines, markers = shaped(kind, lines, shape, n, rnd)
        mutation, data = mutate_text(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"), kind, markers, rnd)
        yield {"case": n, "kind": kind, "input": name, "shape": shape, "mutation": mutation, "data": data,
               "markers": markers}


def counts_of(results: list[dict]) -> dict[str, int]:
    keys = ("internal_error", "hang", "bad_exit", "invalid_json", "leftover_processes", "leftover_files",
            "secrets_shown", "control_bytes", "nothing_read_exit_0", "over_rss")
    return {"cases": len(results), **{what: sum(bool(r[k]) for r in results) for what, k in zip(BAD, keys)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200, help="analyze cases to run (default 200)")
    p.add_argument("--seed", type=int, default=1, help="seed of the mutations (default 1)")
    p.add_argument("--kinds", default=",".join(ALL_KINDS), help=f"input kinds, from {','.join(ALL_KINDS)} (all)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    p.add_argument("--jobs", type=int, default=2, help="cases at once (default 2: this machine's cores)")
    p.add_argument("--max-rss-mb", type=float, default=1536.0,
                   help="peak RSS of a case, MB, above which it is bad (default 1536: a dump read to the "
                        "product's cap stays well under it; a 1 GiB bomb read whole could not)")
    p.add_argument("--tui", type=int, default=0, metavar="N", help="hostile-text TUI cases after (default 0)")
    p.add_argument("--json", type=Path, help="write every case's result here")
    args = p.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if args.count < 0 or args.jobs < 1 or args.tui < 0 or not kinds or set(kinds) - set(ALL_KINDS):
        p.error(f"--count and --tui must be at least 0, --jobs 1, --kinds from {','.join(ALL_KINDS)}")
    started = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_case(c, args.timeout, args.max_rss_mb),
                                make_cases(args.count, args.seed, kinds)))
    wall = time.monotonic() - started
    failed = False
    counts: dict = {}
    if results:
        exits = Counter(r["exit"] for r in results)
        counts = counts_of(results)
        peak = max(results, key=lambda r: r["rss_mb"] or 0)
        print(f"bench/fuzz seed {args.seed}: {len(results)} cases in {wall:.0f} s; exit codes "
              + ", ".join(f"{k}: {v}" for k, v in sorted(exits.items(), key=lambda kv: str(kv[0]))))
        print("  kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["kind"] for r in results).items())))
        for what, n in counts.items():
            print(f"  {what}: {n}")
        print(f"  peak RSS: {peak['rss_mb']} MB (case {peak['case']}, {peak['kind']} {peak['mutation']}); "
              f"bound {args.max_rss_mb:g} MB")
        for r in results:
            if bad(r):
                failed = True
                print(f"  case {r['case']} ({r['kind']} {r['input']}, {r['shape']}, {r['mutation']}): {json.dumps(r)}")
    tui: dict = {}
    if args.tui:
        from fuzz_tui import run as run_tui

        tui = run_tui(args.tui, args.seed, args.jobs)
        failed = failed or bool(tui["bad"])
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "counts": counts, "cases": results, "tui": tui},
                                        indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
