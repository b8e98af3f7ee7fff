#!/usr/bin/env python3
"""Seeded generator of realistic Istio pod captures for the offline benchmark (issue 7).

    python bench/gen.py --packets N --seed S --out DIR [--mix keepalive|short|h2c|mtls]

writes ``DIR/eth0.pcap`` and ``DIR/lo.pcap`` (classic pcap, Ethernet link type, microsecond timestamps; ``lo``
frames carry zero MACs as tcpdump on Linux ``lo`` writes them) and ``DIR/manifest.json``. N is the total over
both files, exactly. The same N and seed give byte-identical files.

The traffic is modelled on one Istio pod (198.18.1.2, fd00:198:18::2): clients in 198.18.2.0/24 and
fd00:198:18:2::/64 call the pod's ports 8080 and 9090 over ``eth0``; for each of those connections the sidecar
opens the upstream leg on ``lo`` (127.0.0.6 -> 198.18.1.2:port, or pod ip -> pod ip for IPv6) when the first
request arrives, forwards every request with Envoy's headers and relays the app's answer. Connection mix:
keep-alive HTTP/1.1 connections with several GETs, bulk downloads (full-size segments, a pure ACK every second
segment), short one-request connections (some IPv6). Packets look like Linux's: SYN options (MSS, SACK_PERM,
timestamps, window scale), the timestamp option on every later segment, per-socket IP ids (0 on SYN-ACK and RST), DF,
TTL 63 for routed clients. Background traffic never looks like a failure: client ports are never shared by two
open connections, every SYN is answered, every connection ends with a FIN handshake, no RST.

That is the default mix, ``keepalive``; ``--mix`` picks another of issue 34's (``gen_mix``'s docstring): ``short``
(one request a connection, ~64 open at once, 3% reset by the client), ``h2c`` (HTTP/2 cleartext, many streams a
connection) or ``mtls`` (Istio mTLS on eth0, plaintext on lo). The keepalive captures are byte for byte what they
were before the mixes existed.

Planted failures (three of each, spread over the capture, shaped like the real kernel's, see the detectors'
docstrings and tests/data/lab-collision-eth0.pcap) are listed in the manifest with their detector, file, key
frame numbers, flow and severity; ``bench/run`` checks ``kubectl-meshdoctor analyze`` against it.

Generation streams: sessions are planned when the capture clock reaches their start and merged by time into the
two writers, so memory is bounded by the connections open at once. With ``--jobs 2`` (default on a multi-core
machine) each file is written by its own process; both run the same seeded plan, so the files are the same as
with ``--jobs 1``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the gen_* modules beside this file, also when it is loaded by path
from gen_pcap import PcapOut  # noqa: E402
from gen_mix import MIXES, plan_for  # noqa: E402
from gen_plan import MIN_DURATION_S, sessions  # noqa: E402
from gen_tcp import FILES  # noqa: E402

GEN_VERSION = 2  # part of bench/run's cache key: bump when the same seed gives other captures


def write_files(out: Path, packets: int, seed: int, rate: float, ifaces: tuple[str, ...],
                mix: str = "keepalive") -> dict:
    """Run the mix's plan and write the files of ``ifaces``; returns per-file frame counts, key-frame marks, the
    planted failures and the capture's time span."""
    plan = plan_for(mix, seed, packets, rate)
    outs = {i: PcapOut(out / FILES[i], plan.chunks.sums) for i in ifaces}
    heap: list = []
    first = last = None
    push, replace, pop = heapq.heappush, heapq.heapreplace, heapq.heappop
    writers = {i: o.write for i, o in outs.items()}
    for start, sess in itertools.chain(sessions(plan), [(None, None)]):
        # Emit every packet due before this session starts (all of them after the last session).
        while heap and (start is None or heap[0][0] <= start):
            last, key, i, s = heap[0]
            spec = s.pkts[i]
            w = writers.get(spec[2].iface)
            if w is not None:
                w(spec)
            i += 1
            if i < len(s.pkts):
                replace(heap, (s.pkts[i][0], key, i, s))
            else:
                pop(heap)
                s.pkts = []  # let the connection's packets go
        if sess is not None:
            push(heap, (sess.pkts[0][0], sess.no, 0, sess))
            first = start if first is None else first
    for o in outs.values():
        o.close()
    return {"frames": {i: o.frames for i, o in outs.items()}, "marks": {i: o.marks for i, o in outs.items()},
            "plants": plan.plants, "first_us": first, "last_us": last, "rate": plan.rate}


def _worker(args: tuple) -> dict:
    return write_files(*args)


def generate(out: str | os.PathLike, packets: int, seed: int, rate: float = 20_000.0, jobs: int = 1,
             mix: str = "keepalive") -> dict:
    """Write eth0.pcap, lo.pcap and manifest.json of ``mix`` (one of MIXES) into ``out``; returns the manifest.
    ValueError for an unknown mix or too few packets."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}: one of {', '.join(MIXES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing

        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as ex:
            results = list(ex.map(_worker, [(out, packets, seed, rate, (i,), mix) for i in ("eth0", "lo")]))
        res = results[0]
        for other in results[1:]:
            res["frames"].update(other["frames"])
            res["marks"].update(other["marks"])
    else:
        res = write_files(out, packets, seed, rate, ("eth0", "lo"), mix)
    planted = []
    for p in res["plants"]:
        marks = res["marks"][p["iface"]]
        frames = {role: marks[tag] for role, tag in p["key"].items()}
        planted.append({"id": p["id"], "detector": p["detector"], "file": p["file"], "iface": p["iface"],
                        "flow": p["flow"], "severity": p["severity"], "key_frames": sorted(frames.values()),
                        "frames": frames, "what": p["what"]})
    total = sum(res["frames"].values())
    assert total == packets, (total, packets)
    manifest = {
        "generator": "bench/gen.py", "version": GEN_VERSION, "mix": mix, "seed": seed, "packets": total,
        "files": {FILES[i]: {"iface": i, "packets": n} for i, n in sorted(res["frames"].items())},
        "rate_pps": round(res["rate"], 1),
        "first_ts": res["first_us"] / 1e6, "last_ts": res["last_us"] / 1e6,
        "duration_s": round((res["last_us"] - res["first_us"]) / 1e6, 6),
        "planted": sorted(planted, key=lambda p: (p["detector"], p["id"])),
        "generate_s": round(time.monotonic() - started, 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, required=True, help="total packets over eth0.pcap and lo.pcap")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mix", choices=MIXES, default="keepalive",
                    help="the traffic: keepalive (default), short, h2c or mtls (issue 34)")
    ap.add_argument("--out", required=True, help="directory for eth0.pcap, lo.pcap and manifest.json")
    ap.add_argument("--rate", type=float, default=20_000.0,
                    help=f"packets per second of capture time (lower for captures under {MIN_DURATION_S:.0f} s)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="1: one process; 2: one process per file (same output)")
    a = ap.parse_args(argv)
    try:
        m = generate(a.out, a.packets, a.seed, a.rate, a.jobs, a.mix)
    except ValueError as e:
        print(f"gen.py: {e}", file=sys.stderr)
        return 2
    files = ", ".join(f"{f} {v['packets']}" for f, v in m["files"].items())
    print(f"wrote {a.out} ({a.mix}): {files}; {len(m['planted'])} planted failures; {m['duration_s']:.1f} s of capture; "
          f"{m['generate_s']:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
