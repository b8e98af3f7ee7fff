"""bench/fuzz: `analyze` against broken captures, counted (issue 15).

Each case is one of the repository's real captures (tests/data: the lab's lo and eth0, a pcapng) with one
mutation drawn from a seeded random source: bits flipped, the file cut short, a pcap record header's lengths
changed, a pcapng block length changed, a TCP header length set below 20 (undissectable TCP), or records
duplicated. Each is run as a user runs it (`python -m kubectl_meshdoctor analyze FILE -o json`; every third case
`-o text`, every third `-o markdown`) in a directory of its own, and counted: exit codes, internal errors and
tracebacks, hangs (past --timeout), JSON that does not parse, files left beside the input, processes left
running. Exit 0 when none of those went wrong, else 1.

    bench/fuzz --count 200 --seed 1 [--timeout 60] [--jobs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
INPUTS = ("lab-collision-eth0.pcap", "lab-collision-lo.pcap", "unnamed-iface-eth0.pcapng")
PCAP_HEADER = 24
RECORD_HEADER = 16


def _records(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of each pcap record (header included) of a little-endian pcap."""
    out, off = [], PCAP_HEADER
    while off + RECORD_HEADER <= len(data):
        caplen = struct.unpack_from("<I", data, off + 8)[0]
        out.append((off, RECORD_HEADER + caplen))
        off += RECORD_HEADER + caplen
    return out


def mutate(data: bytes, pcapng: bool, rnd: random.Random) -> tuple[str, bytes]:
    """One mutation of capture ``data``: (its name, the new bytes)."""
    b = bytearray(data)
    kinds = ["flip", "truncate", "duplicate"] + (["block-length"] if pcapng else ["record-lengths", "tcp-offset"])
    kind = rnd.choice(kinds)
    if kind == "flip":
        for _ in range(rnd.randint(1, 16)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
    elif kind == "truncate":
        del b[rnd.randrange(1, len(b)):]
    elif kind == "duplicate":
        cut = rnd.randrange(PCAP_HEADER, len(b))
        b[cut:cut] = b[cut:cut + rnd.randint(1, 200)]
    elif kind == "block-length":  # pcapng: every block starts with its type, then its total length
        off = 0
        offsets = []
        while off + 8 <= len(b):
            offsets.append(off)
            length = struct.unpack_from("<I", b, off + 4)[0]
            if length < 12 or off + length > len(b):
                break
            off += length
        struct.pack_into("<I", b, rnd.choice(offsets) + 4, rnd.choice([0, 1, 12, 0xFFFFFFFF, rnd.getrandbits(32)]))
    elif kind == "record-lengths":
        off, _ = rnd.choice(_records(data))
        struct.pack_into("<II", b, off + 8, rnd.getrandbits(rnd.choice([4, 16, 32])),
                         rnd.getrandbits(rnd.choice([4, 16, 32])))
    else:  # tcp-offset: Ethernet (14) + IPv4 (20) + 12 is the TCP data offset byte
        off, _ = rnd.choice(_records(data))
        b[off + RECORD_HEADER + 14 + 20 + 12] = rnd.randrange(0, 5) << 4
    return kind, bytes(b)


OUTPUTS = ("json", "text", "markdown")


def run_case(n: int, name: str, kind: str, data: bytes, timeout: float) -> dict:
    """Run analyze on one mutated capture in a directory of its own; what happened."""
    work = Path(tempfile.mkdtemp(prefix=f"meshdoctor-fuzz-{n}-"))
    try:
        target = work / name
        target.write_bytes(data)
        # Every third case renders text, every third markdown: their renderers meet the same odd inputs (a time
        # no clock can show broke only them once), and JSON still gets a third of the cases.
        output = OUTPUTS[n % len(OUTPUTS)]
        proc = subprocess.Popen([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(target), "-o", output],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)
        children: list[psutil.Process] = []
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        t0 = time.monotonic()
        try:
            out, err = proc.communicate(timeout=timeout)
            hang = False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            hang = True
        seconds = time.monotonic() - t0
        result = {"case": n, "input": name, "mutation": kind, "output": output, "exit": proc.returncode,
                  "hang": hang, "seconds": round(seconds, 2)}
        result["internal_error"] = "internal error" in err or "Traceback" in err
        result["bad_exit"] = not hang and proc.returncode not in (0, 1, 2)
        result["invalid_json"] = False
        if proc.returncode in (0, 1) and output == "json":
            try:
                json.loads(out)
            except ValueError:
                result["invalid_json"] = True
        _, alive = psutil.wait_procs(children, timeout=5)
        result["leftover_processes"] = [c.pid for c in alive]
        for c in alive:
            c.kill()
        result["leftover_files"] = sorted(p.name for p in work.iterdir() if p.name != name)
        if result["internal_error"] or result["bad_exit"]:
            result["stderr"] = err.strip().splitlines()[-1:] if err.strip() else []
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bad(r: dict) -> bool:
    return bool(r["internal_error"] or r["bad_exit"] or r["hang"] or r["invalid_json"] or r["leftover_processes"]
                or r["leftover_files"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200, help="cases to run (default 200)")
    p.add_argument("--seed", type=int, default=1, help="seed of the mutations (default 1)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    p.add_argument("--jobs", type=int, default=2, help="cases at once (default 2: this machine's cores)")
    p.add_argument("--json", type=Path, help="write every case's result here")
    args = p.parse_args(argv)
    if args.count < 1 or args.jobs < 1:
        p.error("--count and --jobs must be at least 1")
    rnd = random.Random(args.seed)
    sources = {name: (ROOT / "tests" / "data" / name).read_bytes() for name in INPUTS}
    cases = []
    for n in range(args.count):
        name = rnd.choice(INPUTS)
        kind, data = mutate(sources[name], name.endswith(".pcapng"), rnd)
        cases.append((n, name, kind, data))
    started = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_case(*c, args.timeout), cases))
    wall = time.monotonic() - started
    exits = Counter(r["exit"] for r in results)
    counts = {"cases": len(results), "internal errors": sum(r["internal_error"] for r in results),
              "hangs": sum(r["hang"] for r in results), "exit codes outside 0/1/2": sum(r["bad_exit"] for r in results),
              "invalid JSON": sum(r["invalid_json"] for r in results),
              "leftover processes": sum(bool(r["leftover_processes"]) for r in results),
              "leftover files": sum(bool(r["leftover_files"]) for r in results)}
    print(f"bench/fuzz seed {args.seed}: {len(results)} cases in {wall:.0f} s; exit codes "
          + ", ".join(f"{k}: {v}" for k, v in sorted(exits.items(), key=lambda kv: str(kv[0]))))
    for what, n in counts.items():
        print(f"  {what}: {n}")
    for r in results:
        if bad(r):
            print(f"  case {r['case']} ({r['input']}, {r['mutation']}): {json.dumps(r)}")
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "counts": counts, "cases": results}, indent=1))
    return 1 if any(bad(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
