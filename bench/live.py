"""The live benchmark of issue 7: ``watch --no-tui`` on a lab pod under steady load, with failures planted.

    bench/live [--rate 20000] [--seconds 60] [--plant-every 2.5] [--plants refused,collision]
               [--sidecar-share 0.05] [--connections 16] [--margin 10] [--json FILE] [--full-capture]

Run as root. It brings up its own pod lab (a unique name, one pod `load`, no scenario drivers), starts

    .venv/bin/kubectl-meshdoctor watch pod/load --kubeconfig LAB --no-tui -v --duration SECONDS+MARGIN -o json

and, once its stderr says it is capturing, drives the pod for --seconds at --rate packets/s on lo + eth0
(meshdoctor_lab.scenarios.run_load: keep-alive GETs through the sidecar (real Envoy) and straight to the
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
from live_procs import Child, StderrTTY, spawn, stop_child  # noqa: E402
from live_report import FINDING, print_table, summarise  # noqa: E402

VENV_BIN = Path(sys.executable).parent


def log(msg: str) -> None:
    print(f"[live] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The benchmark could not run (not a missed goal)."""


def _api_port(kubeconfig: Path) -> int:
    import urllib.parse

    import yaml  # the kubernetes client's dependency; a kubeconfig is YAML (JSON included)

    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    port = urllib.parse.urlsplit(server).port
    if port is None:
        raise BenchError(f"no server port in {kubeconfig}")
    return port


def run_bench(args) -> dict[str, Any]:
    from meshdoctor_lab import lab, netns

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
                      "-o", "json", *(["--full-capture"] if args.full_capture else []), "--dissect", args.dissect]
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
        result.update(summarise(args, done, plants, report, tty.lines, cpu))
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
    parser.add_argument("--dissect", choices=("local", "pod"), default="local",
                        help="pass --dissect to watch: pod runs tshark in the debug container; its CPU is then "
                             "reported apart, as the relay's is (default local)")
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
