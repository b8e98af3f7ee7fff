"""The live benchmark of issue 7: ``watch --no-tui`` on a lab pod under steady load, with failures planted.

    bench/live [--rate 20000] [--seconds 60] [--plant-every 2.5] [--plants refused,collision]
               [--sidecar-share 0.05] [--connections 16] [--margin 10] [--json FILE] [--full-capture]

Run as root. It brings up its own pod lab (a unique name, one pod `load`, no scenario drivers), starts

    .venv/bin/kubectl-meshdoctor watch pod/load --kubeconfig LAB --no-tui -v --duration SECONDS+MARGIN -o json

and, once its stderr says it is capturing, drives the pod for --seconds at --rate packets/s on lo + eth0
(kubectl_meshdoctor.lab.scenarios.run_load: keep-alive GETs through the sidecar (real Envoy) and straight to the
app, paced by a token bucket and steered by the pod's own packet counters; bounded by time and by count,
lab addresses only), while a planter, every --plant-every seconds, plants one failure and records its
wall-clock time:

- refused:   a connection to pod:51NN (NN = the plant's number), REDIRECTed to the sidecar, whose connect
             to the app port (nothing listens) is answered by RST on lo: `upstream-refused`, server pod:51NN.
- collision: client:X holds a keep-alive to pod:5000; only that connection's conntrack entry is deleted in
             the pod (the load keeps its entries), then client:X dials pod:5002: the pod answers with an
             RFC 5961 challenge ACK on eth0: `tuple-collision`, client:X -> pod:5002.

watch's stderr is a pseudo-terminal: watch prints each finding there as it concludes it (to a terminal;
`-v` alone gives progress lines only), and each line is stamped with time.time() as it arrives. From the
report (`source.captures`: tcpdump's captured and dropped_by_kernel, tshark's frames_read) and those lines it
reports the achieved packets/s (the pod's kernel counters over the load window), tcpdump's kernel drops, the
packets the pipeline did not analyse (captured - frames_read), each planted failure found or not (by detector
and flow) and the latency from each planted failure's deciding packet (the finding's ts, same clock) to its
line (median, p99), plus the CPU each process used. Exit status 0 when every goal is met, 1 when one is
missed (a drop, an unanalysed packet, a planted failure not found, p99 >= 1 s, under 90% of --rate), 2 when
the benchmark itself could not run. The lab and every process started here are gone afterwards, even on
Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # the live_* modules beside this file, also when it is loaded by path
from live_client import POD, cmd_generate, cmd_plant  # noqa: E402
from live_measure import CpuMeter, Sampler, process_groups, split_tshark  # noqa: E402
from live_procs import Child, Line, StderrTTY, spawn, stop_child  # noqa: E402

VENV_BIN = Path(sys.executable).parent
GOAL_P99_S = 1.0
GOAL_RATE_FRACTION = 0.9
FINDING = re.compile(r"^(error|warning|info): ([\w.-]+): (.*) \((\S+) -> (\S+)\)$")


def log(msg: str) -> None:
    print(f"[live] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The benchmark could not run (not a missed goal)."""


# --- the benchmark itself ------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _api_port(kubeconfig: Path) -> int:
    import urllib.parse

    import yaml  # the kubernetes client's dependency; a kubeconfig is YAML (JSON included)

    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    port = urllib.parse.urlsplit(server).port
    if port is None:
        raise BenchError(f"no server port in {kubeconfig}")
    return port


def _match(plants: list[dict], report: dict, finding_lines: list[tuple[Line, re.Match]]) -> tuple[list, list]:
    """Each plant with its finding (detector and flow) and live line; the findings no plant explains."""
    findings = [f for f in report.get("findings", []) if f.get("flow")]
    used: set[int] = set()
    rows = []
    for plant in plants:
        row = {"n": plant["n"], "kind": plant["kind"], "planted_at": plant["t"], "detector": plant["detector"],
               "client": plant["client"], "server": plant["server"], "found": False, "finding_ts": None,
               "line_at": None, "latency_s": None, "plant_error": plant.get("error")}
        for i, f in enumerate(findings):
            flow = f["flow"]
            if (i in used or f["detector"] != plant["detector"] or flow.get("server") != plant["server"]
                    or (plant["client"] and flow.get("client") != plant["client"])):
                continue
            used.add(i)
            row.update(found=True, finding_ts=f.get("ts"), severity=f.get("severity"), title=f.get("title"),
                       flow_client=flow.get("client"))
            for line, m in finding_lines:
                if m.group(2) == f["detector"] and m.group(4) == flow.get("client") and m.group(5) == flow.get("server"):
                    row["line_at"] = line.t
                    if f.get("ts"):
                        row["latency_s"] = round(line.t - f["ts"], 4)
                    break
            break
        rows.append(row)
    unplanned = [f for i, f in enumerate(findings) if i not in used]
    return rows, unplanned


def run_bench(args) -> dict[str, Any]:
    from kubectl_meshdoctor.lab import lab, netns

    name = f"mdbench-{secrets.token_hex(3)}"
    state_dir = lab.default_state_dir(name)
    prefix = netns.netns_prefix(name)
    children: list[Child] = []
    tty: StderrTTY | None = None
    result: dict[str, Any] = {"lab": name, "args": {k: str(v) if isinstance(v, Path) else v
                                                    for k, v in vars(args).items() if k != "func"}}
    try:
        log(f"bringing up lab {name} (pod {POD}, no scenario drivers) in {state_dir}")
        state = lab.up(name, state_dir, (POD,), drivers=False, ready_timeout=60.0)
        pod = state.pod(POD)
        watch_argv = [str(args.watch_exe), "watch", f"pod/{POD}", "--kubeconfig",
                      str(state.kubeconfig), "--no-tui", "-v", "--duration", f"{args.seconds + args.margin:g}",
                      "-o", "json", *(["--full-capture"] if args.full_capture else [])]
        result["watch_argv"] = watch_argv
        tty = StderrTTY()
        watch = spawn("watch", watch_argv, children, stdout=subprocess.PIPE, stderr=tty.slave)
        tty.start()
        stdout_chunks: list[bytes] = []
        out_reader = threading.Thread(target=lambda: stdout_chunks.append(watch.proc.stdout.read()), daemon=True)
        out_reader.start()
        deadline = time.monotonic() + args.ready_timeout
        while not tty.capturing.wait(0.2):
            if watch.proc.poll() is not None or time.monotonic() > deadline:
                tail = " | ".join(l.text for l in tty.lines[-5:])
                raise BenchError(f"watch did not start capturing (exit {watch.proc.poll()}): {tail}")
        log(f"watch is capturing: {tty.lines[-1].text}")
        sampler = Sampler(state.pids[f"{POD}/app-http"], _api_port(state.kubeconfig))
        sampler.start()

        in_client = ["ip", "netns", "exec", pod.client_netns, sys.executable, str(HERE / "live.py")]
        common = ["--pod-ip", pod.pod_ip, "--client-ip", pod.client_ip, "--pod-netns", pod.netns]
        gen = spawn("generator", in_client + ["_generate", *common, "--rate", f"{args.rate:g}", "--seconds",
                                                f"{args.seconds:g}", "--sidecar-share", f"{args.sidecar_share:g}",
                                                "--connections", str(args.connections)],
                     children, stdout=subprocess.PIPE)
        gen.follow_lines()
        deadline = time.monotonic() + 30.0
        while not any(e.get("event") == "started" for e in gen.events()):
            if gen.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the load generator did not start (exit {gen.proc.poll()})")
            time.sleep(0.02)
        started = next(e["t"] for e in gen.events() if e.get("event") == "started")
        groups = process_groups(state, watch.proc.pid)
        meter = CpuMeter()
        meter.start(groups)
        log(f"load: {args.rate:g} packets/s for {args.seconds:g} s; planting {args.plants} every "
            f"{args.plant_every:g} s")
        planter = None
        if args.plants:
            planter = spawn("planter", in_client + ["_plant", *common, "--every", f"{args.plant_every:g}",
                                                     "--until", f"{started + args.seconds:.6f}", "--kinds",
                                                     args.plants], children, stdout=subprocess.PIPE)
            planter.follow_lines()
        try:
            gen.proc.wait(args.seconds + 30.0)
        except subprocess.TimeoutExpired:
            raise BenchError("the load generator did not stop at --seconds") from None
        gen.reader.join(5.0)
        cpu = meter.stop(groups)
        split_tshark(cpu, watch.proc.pid, meter.before["watch (python)"], meter.after["watch (python)"])
        done = next((e for e in gen.events() if e.get("event") == "done"), None)
        if done is None:
            raise BenchError(f"the load generator ended without a result (exit {gen.proc.returncode})")
        cpu["cores"]["load generator"] = round(done["cpu_s"] / max(done["ended"] - done["started"], 1e-9), 3)
        cpu["other_cores"] = round(cpu["machine_cores_busy"] - sum(cpu["cores"].values()), 3)
        if planter is not None:
            try:
                planter.proc.wait(30.0)
            except subprocess.TimeoutExpired:
                raise BenchError("the planter did not stop") from None
            planter.reader.join(5.0)
        plants = [e for e in (planter.events() if planter else []) if e.get("event") == "plant"]
        log(f"load done ({done['achieved_pps']} packets/s); waiting for watch to end its --duration")
        try:
            watch.proc.wait(args.margin + 180.0)
        except subprocess.TimeoutExpired:
            raise BenchError("watch did not end after its --duration") from None
        out_reader.join(10.0)
        tty.closed.wait(5.0)
        sampler.stop()
        result["samples"] = [{**r, "t": round(r["t"] - started, 3)} for r in sampler.rows]
        raw = b"".join(stdout_chunks)
        result["watch_exit"] = watch.proc.returncode
        result["watch_stderr_tail"] = [l.text for l in tty.lines if not FINDING.match(l.text)][-15:]
        if any("Traceback" in l.text for l in tty.lines):
            result["watch_traceback"] = [l.text for l in tty.lines]
        try:
            report = json.loads(raw)
        except ValueError:
            raise BenchError(f"watch printed no JSON report (exit {watch.proc.returncode}): "
                             + " | ".join(result["watch_stderr_tail"][-5:])) from None
        result.update(_summarise(args, done, plants, report, tty.lines, cpu))
        return result
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if tty is not None and children and children[0].name == "watch" and children[0].proc.poll() is None:
            stop_child(children[0], signal.SIGINT, 30.0)  # watch stops its tcpdumps on SIGINT
        for child in reversed(children):
            stop_child(child)
        if tty is not None:
            tty.close()
        try:
            lab.down(state_dir)
        except Exception as exc:  # report it, still check what is left
            log(f"lab down: {exc}")
        left = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if ns.startswith(prefix + "-")]
        if left:
            log(f"LEFT BEHIND: network namespaces {left}")
        result["cleanup"] = {"netns_left": left, "state_dir_left": state_dir.exists()}


def _summarise(args, done: dict, plants: list[dict], report: dict, lines: list[Line], cpu: dict) -> dict:
    captures = report.get("source", {}).get("captures", {})
    ifaces = {}
    for iface in ("lo", "eth0"):
        c = captures.get(iface, {})
        captured, read = c.get("captured"), c.get("frames_read")
        ifaces[iface] = {"captured": captured, "dropped_by_kernel": c.get("dropped_by_kernel"), "frames_read": read,
                         "unanalysed": captured - read if captured is not None and read is not None else None,
                         "bytes": c.get("bytes"),
                         "detector_packets": report.get("stats", {}).get("interfaces", {}).get(iface, {}).get("packets")}
    finding_lines = [(l, m) for l in lines if (m := FINDING.match(l.text))]
    rows, unplanned = _match(plants, report, finding_lines)
    latencies = [r["latency_s"] for r in rows if r["latency_s"] is not None]
    all_lat = []
    for f in report.get("findings", []):
        flow = f.get("flow") or {}
        for line, m in finding_lines:
            if m.group(2) == f["detector"] and m.group(4) == flow.get("client") and m.group(5) == flow.get("server"):
                if f.get("ts"):
                    all_lat.append(line.t - f["ts"])
                break
    drops = [v["dropped_by_kernel"] for v in ifaces.values()]
    unanalysed = [v["unanalysed"] for v in ifaces.values()]
    p50, p99 = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    achieved = done.get("achieved_pps")
    goals = {
        "rate": achieved is not None and achieved >= GOAL_RATE_FRACTION * args.rate,
        "no_drops": all(d is not None for d in drops) and sum(drops) == 0,
        "none_unanalysed": all(u is not None for u in unanalysed) and sum(unanalysed) == 0,
        "all_planted_found": bool(rows) and all(r["found"] for r in rows),
        "p99_under_1s": p99 is not None and p99 < GOAL_P99_S and len(latencies) == len(rows),
    }
    by_kind: dict[str, int] = {}
    for f in unplanned:
        key = f"{f['severity']} {f['detector']}"
        by_kind[key] = by_kind.get(key, 0) + 1
    return {
        "load": {k: done.get(k) for k in ("target_pps", "seconds", "started", "ended", "sent", "ok", "late",
                                          "stopped_by", "by_path", "packets", "achieved_pps", "errors")},
        "timeline_pps": done.get("timeline"),
        "captures": ifaces,
        "report_stats": report.get("stats"),
        "report_problems": report.get("problems", []),
        "envoy": {k: v for k, v in (report.get("envoy") or {}).items() if k != "counters_moved"},
        "planted": rows,
        "latency_s": {"n": len(latencies), "median": p50, "p99": p99, "max": max(latencies, default=None)},
        "latency_all_findings_s": {"n": len(all_lat), "median": _percentile(all_lat, 0.5),
                                   "p99": _percentile(all_lat, 0.99)},
        "unplanned_findings": by_kind,
        "cpu": cpu,
        "goals": goals,
        "ok": all(goals.values()),
    }


def _fmt(v: Any, spec: str = "") -> str:
    return "n/a" if v is None else format(v, spec)


def print_table(res: dict[str, Any]) -> None:
    out = []
    a = res["args"]
    load = res["load"]
    pk = load.get("packets") or {}
    goals = res["goals"]
    mark = {True: "ok", False: "MISSED"}
    out.append(f"live benchmark: watch pod/{POD} --no-tui, {a['rate']:g} packets/s asked for {a['seconds']:g} s "
               f"(lab {res['lab']})")
    out.append(f"  achieved      {_fmt(load.get('achieved_pps'), ',.0f')} packets/s on lo + eth0 (pod kernel counters: "
               f"lo {pk.get('lo')}, eth0 rx {pk.get('eth0_rx')} tx {pk.get('eth0_tx')})   [{mark[goals['rate']]}]")
    paths = ", ".join(f"{p} {v['ok']}/{v['sent']}" for p, v in (load.get("by_path") or {}).items())
    out.append(f"  requests      {load.get('ok')} ok of {load.get('sent')} sent ({paths}); late {load.get('late')}; "
               f"errors {len(load.get('errors') or [])}")
    out.append(f"  {'iface':<6} {'captured':>10} {'kernel drops':>13} {'frames read':>12} {'unanalysed':>11} "
               f"{'to detectors':>13} {'MB':>7}")
    for iface, c in res["captures"].items():
        mb = None if c["bytes"] is None else c["bytes"] / 1e6
        out.append(f"  {iface:<6} {_fmt(c['captured']):>10} {_fmt(c['dropped_by_kernel']):>13} "
                   f"{_fmt(c['frames_read']):>12} {_fmt(c['unanalysed']):>11} {_fmt(c['detector_packets']):>13} "
                   f"{_fmt(mb, '.1f'):>7}")
    out.append(f"  drops [{mark[goals['no_drops']]}]   unanalysed [{mark[goals['none_unanalysed']]}]")
    found = sum(r["found"] for r in res["planted"])
    out.append(f"  planted       {found}/{len(res['planted'])} found   [{mark[goals['all_planted_found']]}]")
    for r in res["planted"]:
        flow = f"{r['client'] or r.get('flow_client') or '*'} -> {r['server']}"
        out.append(f"    #{r['n']:<3} {r['kind']:<10} {r['detector']:<16} {flow:<42} "
                   + (f"found, latency {_fmt(r['latency_s'], '.3f')} s" if r["found"] else "NOT FOUND")
                   + (f"  (plant error: {r['plant_error']})" if r.get("plant_error") else ""))
    lat = res["latency_s"]
    out.append(f"  latency       packet -> finding line: median {_fmt(lat['median'], '.3f')} s, p99 "
               f"{_fmt(lat['p99'], '.3f')} s, max {_fmt(lat['max'], '.3f')} s (n={lat['n']})   "
               f"[{mark[goals['p99_under_1s']]}]")
    if res["unplanned_findings"]:
        out.append("  unplanned     " + ", ".join(f"{k} x{v}" for k, v in sorted(res["unplanned_findings"].items())))
    for p in res["report_problems"]:
        out.append(f"  problem       {p.get('where')}: {p.get('what')}")
    cpu = res["cpu"]
    out.append(f"  cpu (cores, load window {cpu['wall_s']:.0f} s, {cpu['ncpu']} cpus): "
               + ", ".join(f"{k} {v:.2f}" for k, v in cpu["cores"].items())
               + f"; machine busy {cpu['machine_cores_busy']:.2f} (softirq {cpu['softirq_cores']:.2f}), "
                 f"steal {cpu['steal_cores']:.2f}, rest {cpu['other_cores']:.2f} ("
               + ", ".join(f"{k} {v:.2f}" for k, v in cpu["other_processes"].items()) + ")")
    out.append(f"  watch exit {res.get('watch_exit')}; result: {'all goals met' if res['ok'] else 'GOAL MISSED'}")
    print("\n".join(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/live", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    for cmd in ("_generate", "_plant"):  # run in the pod's client namespace by the benchmark itself
        sp = sub.add_parser(cmd)
        sp.add_argument("--pod-ip", required=True)
        sp.add_argument("--client-ip", required=True)
        sp.add_argument("--pod-netns", required=True)
        if cmd == "_generate":
            sp.add_argument("--rate", type=float, required=True)
            sp.add_argument("--seconds", type=float, required=True)
            sp.add_argument("--sidecar-share", type=float, required=True)
            sp.add_argument("--connections", type=int, required=True)
            sp.set_defaults(func=cmd_generate)
        else:
            sp.add_argument("--every", type=float, required=True)
            sp.add_argument("--until", type=float, required=True)
            sp.add_argument("--kinds", required=True)
            sp.set_defaults(func=cmd_plant)
    parser.add_argument("--rate", type=float, default=20000.0, help="packets/s on the pod's lo + eth0 (default 20000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--plant-every", type=float, default=2.5, help="seconds between planted failures")
    parser.add_argument("--plants", default="refused,collision",
                        help="kinds of planted failures, in turn: refused, collision ('' for none)")
    parser.add_argument("--sidecar-share", type=float, default=0.05,
                        help="share of the packets that go through the sidecar, real Envoy (default 0.05)")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections per load path")
    parser.add_argument("--margin", type=float, default=10.0, help="watch's --duration is --seconds plus this")
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="seconds for watch to start capturing")
    parser.add_argument("--full-capture", action="store_true", help="pass --full-capture to watch")
    parser.add_argument("--watch-exe", type=Path, default=VENV_BIN / "kubectl-meshdoctor",
                        help="the kubectl-meshdoctor executable to run (default: the venv's)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON to FILE")
    args = parser.parse_args(argv)
    if args.cmd:
        return args.func(args)
    if os.geteuid() != 0:
        print("bench/live: needs root (network namespaces, iptables, conntrack)", file=sys.stderr)
        return 2
    kinds = [k for k in args.plants.split(",") if k]
    if any(k not in ("refused", "collision") for k in kinds):
        print("bench/live: --plants takes refused and/or collision", file=sys.stderr)
        return 2
    if not 0 < args.seconds <= 3600 or not 0 < args.rate <= 200_000 or args.plant_every < 1.5:
        print("bench/live: --seconds (0, 3600], --rate (0, 200000], --plant-every >= 1.5", file=sys.stderr)
        return 2
    if shutil.which("tshark") is None or shutil.which("tcpdump") is None:
        print("bench/live: needs tshark and tcpdump", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    load_before = os.getloadavg()
    try:
        res = run_bench(args)
    except BenchError as exc:
        print(f"bench/live: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench/live: interrupted; lab taken down", file=sys.stderr)
        return 130
    res["loadavg_before"] = load_before
    print_table(res)
    if res.get("watch_traceback"):
        print("watch printed a traceback:\n" + "\n".join(res["watch_traceback"]), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    if res["cleanup"]["netns_left"] or res["cleanup"]["state_dir_left"]:
        return 2
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
