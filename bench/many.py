"""The many-pods benchmark of issues 17 and 34: ``watch -l`` over N lab pods, each with steady light traffic and one
planted failure, and what the plugin costs for them.

    bench/many [--pods 10,100] [--seconds 40] [--rate 40] [--margin 15] [--json FILE]

Run as root. It brings up one pod lab of max(--pods) `load` pods (real Envoy as each sidecar, no scenario
drivers), and for each N in --pods (ascending) runs

    .venv/bin/kubectl-meshdoctor watch -l GROUP --kubeconfig LAB --no-tui -v --duration BOUND -o json

over the first N pods (a label the lab's API server puts on them), stopped by SIGINT --margin seconds after the
load ends (BOUND is only a bound: each pod's --duration counts from its own capture's start). Each pod gets a
driver in its client network namespace (``many.py _pod``): keep-alive GETs at --rate packets/s
for --seconds (meshdoctor_lab.scenarios.run_load, through the sidecar and straight to the app; bounded
by time and count, lab addresses only) and one planted failure at its own moment (pods alternate: upstream
refused on lo, four-tuple collision with its challenge ACK on eth0; see bench/live_client.py). The drivers are
started before watch and go together once watch captures every pod: a hundred Python starts (~0.3 s of CPU
each) are not in the measured window.

Measured, side by side for each N: the peak summed RSS of watch and every child (tshark, dumpcap; psutil every
0.5 s), the CPU watch's tree used over the load, every planted failure found or not (detector and flow in the
JSON report), the latency from the deciding packet (the finding's ts) to its line on watch's stderr (a pty),
and drops (tcpdump's kernel drops; captured packets tshark did not read). The goals, printed with PASS/FAIL:
at the largest N, summed RSS under 600 MB, every planted failure found, p99 latency under 2 s, no drop; and
the cost of a pod, (RSS at the largest N - RSS at the smallest) / (difference in pods), stated.

Exit status 0 when every goal is met, 1 when one is missed, 2 when the benchmark itself could not run. The lab
and every process started here are gone afterwards, even on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from live_procs import Child, StderrTTY, spawn, stop_child  # noqa: E402
from live_report import FINDING, _match, _percentile  # noqa: E402

VENV_BIN = Path(sys.executable).parent
RSS_GOAL_MB = 600.0
P99_GOAL_S = 2.0
_CAPTURING = re.compile(r"^capturing .* in pod/(\S+) via ")  # watch -v: one line a pod once tcpdump listens
GROUP_LABEL = "bench-many"  # pod i carries bench-many-gN=yes for every N in --pods with i <= N


def log(msg: str) -> None:
    print(f"[many] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The benchmark could not run (not a missed goal)."""


class TreeRss:
    """Peak summed RSS (bytes) of a process and all its children, sampled every 0.5 s in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.samples = pid, 0, 0
        self.peak_by_name: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            total, names = 0, {}
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    names[p.name()] = names.get(p.name(), 0) + rss
                    total += rss
                except psutil.Error:
                    pass
            self.samples += 1
            if total > self.peak:
                self.peak, self.peak_by_name = total, names

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _tree_cpu(pid: int) -> float:
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                ct = p.cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def run_one(args, state, n: int, children: list[Child]) -> dict[str, Any]:
    """watch over the first ``n`` pods of the lab under load, one planted failure each -> the measurements."""
    pods = state.pods[:n]
    argv = [str(args.watch_exe), "watch", "-l", f"{GROUP_LABEL}-g{n}=yes", "--kubeconfig", str(state.kubeconfig),
            "--no-tui", "-v", "--duration", f"{_bound_s(args, n):g}", "-o", "json", "--dissect", args.dissect]
    # The drivers start, and wait for their go, before watch does: a pod's --duration counts from its capture's
    # start, and a hundred Python starts (~0.3 s of CPU each) took ~20 s on 2 cores, so started after the
    # capture they pushed the last plants past the end of watch's capture (pod 100's missed at 40 s).
    drivers = []
    for i, pod in enumerate(pods):
        at = 6.0 + (args.seconds - 10.0) * i / max(n, 1)  # plants spread over the window
        kind = "refused" if i % 2 == 0 else "collision"
        drivers.append(spawn(f"pod-{pod.name}", [
            "ip", "netns", "exec", pod.client_netns, sys.executable, str(HERE / "many.py"), "_pod",
            "--pod-ip", pod.pod_ip, "--client-ip", pod.client_ip, "--pod-netns", pod.netns,
            "--rate", f"{args.rate:g}", "--seconds", f"{args.seconds:g}", "--plant-at", f"{at:.2f}",
            "--kind", kind], children, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
        drivers[-1].follow_lines()
    # Each driver's Python start comes before the window, not in it: fifty at once held both cores for seconds,
    # and the packets of the first plants waited for the CPU, not for watch.
    t_ready, deadline = time.monotonic(), time.monotonic() + 60 + n
    while not all(any(e.get("event") == "ready" for e in d.events()) for d in drivers):
        if time.monotonic() > deadline or any(d.proc.poll() is not None for d in drivers):
            raise BenchError("a pod's driver did not get ready: "
                             + " | ".join(line.text for d in drivers for line in d.lines[-1:])[:500])
        time.sleep(0.2)
    log(f"{n} drivers ready in {time.monotonic() - t_ready:.1f} s")
    tty = StderrTTY()
    watch = spawn(f"watch-{n}", argv, children, stdout=subprocess.PIPE, stderr=tty.slave)
    tty.start()
    rss = TreeRss(watch.proc.pid)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(watch.proc.stdout.read()), daemon=True)
    reader.start()
    try:
        t_watch, deadline = time.monotonic(), time.monotonic() + 60 + 3 * n
        capturing: set[str] = set()
        while len(capturing) < n:
            capturing = {m.group(1) for line in list(tty.lines) if (m := _CAPTURING.match(line.text))}
            if watch.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"watch over {n} pods captured {len(capturing)} (exit {watch.proc.poll()}): "
                                 + " | ".join(line.text for line in tty.lines[-3:]))
            time.sleep(0.2)
        starts = [line.t for line in list(tty.lines) if _CAPTURING.match(line.text)]
        log(f"watch captures all {n} pods {time.monotonic() - t_watch:.1f} s after its start (the first pod "
            f"{max(starts) - min(starts):.1f} s before the last)")
        log(f"driving each at {args.rate:g} packets/s for {args.seconds:g} s")
        cpu0, t0 = _tree_cpu(watch.proc.pid), time.monotonic()
        for d in drivers:
            try:
                d.proc.stdin.write(b"go\n")
                d.proc.stdin.close()
            except BrokenPipeError:
                raise BenchError(f"{d.name} ended before its go") from None
        for d in drivers:
            try:
                d.proc.wait(args.seconds + 60)
            except subprocess.TimeoutExpired:
                raise BenchError(f"{d.name} did not end after --seconds") from None
            d.reader.join(5)
        cpu = _tree_cpu(watch.proc.pid) - cpu0
        wall = time.monotonic() - t0
        # Stopped as a user stops it, --margin seconds after the load: a pod's --duration counts from its own
        # capture's start, and a hundred pods' starts spread over ~30 s, so a --duration of the load's length
        # ended the first pods' captures while their load still ran.
        try:
            watch.proc.wait(args.margin)
        except subprocess.TimeoutExpired:
            watch.proc.send_signal(signal.SIGINT)
        t_stop = time.monotonic()
        try:
            watch.proc.wait(120 + n)
        except subprocess.TimeoutExpired:
            raise BenchError(f"watch over {n} pods did not end after its SIGINT") from None
        log(f"watch over {n} pods ended {time.monotonic() - t_stop:.1f} s after its SIGINT")
        reader.join(10)
        tty.closed.wait(5)
    finally:
        rss.stop()
    plants = [e for d in drivers for e in d.events() if e.get("event") == "plant"]
    loads = [e for d in drivers for e in d.events() if e.get("event") == "done"]
    try:
        report = json.loads(b"".join(out))
    except ValueError:
        raise BenchError(f"watch over {n} pods printed no JSON report (exit {watch.proc.returncode}): "
                         + " | ".join(line.text for line in tty.lines[-5:])) from None
    if args.json:  # watch's own report beside the results: what a miss or a drop was, read afterwards
        args.json.with_name(f"{args.json.stem}-watch{n}.json").write_bytes(b"".join(out))
    lines = [(line, m) for line in tty.lines if (m := FINDING.match(line.text))]
    rows, _ = _match(plants, report, lines)
    captured = dropped = unread = counted = 0
    for per_pod in report["source"].get("per_pod", [report["source"]]):
        for cap in per_pod.get("captures", {}).values():
            counted += cap.get("captured") is not None
            captured += cap.get("captured") or 0
            dropped += cap.get("dropped_by_kernel") or 0
            if cap.get("captured") is not None and cap.get("frames_read") is not None:
                unread += max(0, cap["captured"] - cap["frames_read"])
            elif cap.get("captured"):
                unread += cap["captured"]  # nothing says tshark read them
    latencies = [r["latency_s"] for r in rows if r["latency_s"] is not None]
    return {
        "pods": n, "watch_exit": watch.proc.returncode, "rss_peak_mb": round(rss.peak / 2**20, 1),
        "rss_peak_by_process_mb": {k: round(v / 2**20, 1) for k, v in sorted(rss.peak_by_name.items())},
        "rss_samples": rss.samples, "cpu_cores": round(cpu / max(wall, 1e-9), 3),
        "crossing_packets": captured, "cpu_us_per_crossing_packet": round(cpu / captured * 1e6, 1) if captured
        else None, "achieved_pps": sum(e.get("achieved_pps") or 0 for e in loads),
        "dropped_by_kernel": dropped, "unanalysed": unread, "interfaces_counted": counted,
        "planted": len(plants), "found": sum(r["found"] for r in rows),
        "missed": [f"{r['kind']} {r['server']}" for r in rows if not r["found"]],
        # What a miss was: the plant's own account, and what the report says of that server instead.
        "missed_detail": [{**next(p for p in plants if p["server"] == r["server"] and p["client"] == r["client"]),
                           "findings_on_server": [(f["detector"], f["flow"].get("client"), f.get("ts"))
                                                  for f in report.get("findings", [])
                                                  if (f.get("flow") or {}).get("server") == r["server"]]}
                          for r in rows if not r["found"]],
        "unmatched_lines": sum(1 for r in rows if r["found"] and r["latency_s"] is None),
        "latency_median_s": _percentile(latencies, 0.5), "latency_p99_s": _percentile(latencies, 0.99),
        "problems": report.get("problems", [])[:10],
    }


def _bound_s(args, n: int) -> float:
    """watch's --duration: only a bound (the benchmark stops it with SIGINT), longer than any pod's capture
    needs: its start may come up to ~0.5 s a pod after the first's (8 pods set up at a time), then the load."""
    return args.seconds + args.margin + 60 + n


def verdict(results: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """The goal lines (PASS/FAIL) and whether every goal was met."""
    big = results[-1]
    lines, ok = [], True

    def goal(passed: bool, text: str) -> None:
        nonlocal ok
        ok &= passed
        lines.append(f"{'PASS' if passed else 'FAIL'}: {text}")

    goal(big["rss_peak_mb"] < RSS_GOAL_MB, f"{big['pods']} pods: peak summed RSS {big['rss_peak_mb']} MB "
                                           f"(goal under {RSS_GOAL_MB:.0f} MB)")
    goal(big["planted"] == big["found"] and big["planted"] == big["pods"],
         f"{big['pods']} pods: planted failures found {big['found']}/{big['planted']} (one a pod)")
    p99 = big["latency_p99_s"]
    goal(p99 is not None and p99 < P99_GOAL_S, f"{big['pods']} pods: p99 packet-to-finding {p99} s "
                                               f"(goal under {P99_GOAL_S:g} s)")
    # No drop is only shown by tcpdump's counts of every pod's lo and eth0 (watch's interfaces): a report without
    # them (a wind-down given up) proves nothing.
    counted = big.get("interfaces_counted", 0)
    goal(big["dropped_by_kernel"] == 0 and big["unanalysed"] == 0 and counted == 2 * big["pods"],
         f"{big['pods']} pods: {big['dropped_by_kernel']} dropped by the kernel, {big['unanalysed']} unanalysed, "
         f"{counted}/{2 * big['pods']} interfaces counted (goal 0, 0, all)")
    if len(results) > 1:
        small = results[0]
        per_pod = (big["rss_peak_mb"] - small["rss_peak_mb"]) / (big["pods"] - small["pods"])
        cpu = (big["cpu_cores"] - small["cpu_cores"]) / (big["pods"] - small["pods"])
        lines.append(f"cost of a pod: {per_pod:.1f} MB of summed RSS, {cpu * 1000:.1f} millicores at "
                     f"{results[-1].get('rate', '?')} packets/s a pod ({small['pods']} -> {big['pods']} pods)")
    return lines, ok


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'pods':>5} {'RSS MB':>8} {'cores':>6} {'us/pkt':>7} {'pkts/s':>7} {'crossed':>8} {'drops':>6} "
          f"{'unread':>6} {'found':>7} {'lat med s':>9} {'p99 s':>7}  RSS by process MB")
    for r in results:
        med = "-" if r["latency_median_s"] is None else round(r["latency_median_s"], 3)
        p99 = "-" if r["latency_p99_s"] is None else round(r["latency_p99_s"], 3)
        print(f"{r['pods']:>5} {r['rss_peak_mb']:>8} {r['cpu_cores']:>6} {r['cpu_us_per_crossing_packet'] or '-':>7} "
              f"{round(r['achieved_pps']):>7} {r['crossing_packets']:>8} {r['dropped_by_kernel']:>6} {r['unanalysed']:>6} "
              f"{r['found']:>3}/{r['planted']:<3} {med:>9} {p99:>7}  {r['rss_peak_by_process_mb']}")


def run_bench(args) -> list[dict[str, Any]]:
    from meshdoctor_lab import lab, netns

    sizes = sorted(set(args.pods))
    name = f"mdmany-{secrets.token_hex(3)}"
    state_dir = lab.default_state_dir(name)
    prefix = netns.netns_prefix(name)
    names = [f"m{i:02d}" for i in range(1, sizes[-1] + 1)]
    children: list[Child] = []
    results = []
    try:
        log(f"bringing up lab {name}: {len(names)} load pods")
        t = time.monotonic()
        state = lab.up(name, state_dir, [f"{p}=load" for p in names], drivers=False, ready_timeout=120.0,
                       spec_patches=_group_patches(names, sizes))
        log(f"lab up in {time.monotonic() - t:.0f} s")
        for n in sizes:
            res = run_one(args, state, n, children)
            res["rate"] = args.rate
            results.append(res)
            log(json.dumps({k: v for k, v in res.items() if k != "problems"}))
        return results
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in reversed(children):
            stop_child(child, signal.SIGINT if child.name.startswith("watch") else signal.SIGTERM)
        try:
            lab.down(state_dir)
        except Exception as exc:
            log(f"lab down: {exc}")
        left = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if ns.startswith(prefix + "-")]
        if left:
            log(f"LEFT BEHIND: network namespaces {left}")


def _group_patches(names: list[str], sizes: list[int]) -> dict[str, list[dict]]:
    """RFC 6902 patches for the lab's API server: pod number i gets the label ``bench-many-gN=yes`` for every N
    in ``sizes`` with i <= N, so ``-l bench-many-gN=yes`` selects the first N pods."""
    out: dict[str, list[dict]] = {}
    for i, p in enumerate(names, start=1):
        out[p] = [{"op": "add", "path": f"/metadata/labels/{GROUP_LABEL}-g{n}", "value": "yes"}
                  for n in sizes if i <= n]
    return out


def cmd_pod(args) -> int:
    """In a pod's client namespace: the load for --seconds, and one planted failure at --plant-at seconds."""
    from live_client import _emit, _plant_collision, _plant_refused

    from meshdoctor_lab.scenarios import run_load
    from meshdoctor_lab.state import LabPod

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pod = LabPod(name="load", scenario="load", netns=args.pod_netns, client_netns="", pod_ip=args.pod_ip,
                 client_ip=args.client_ip, ports=(), uid="")
    _emit({"event": "ready"})
    if not sys.stdin.readline():  # the benchmark's go, once every pod's driver is ready; EOF: it is gone
        return 1
    start = time.time()

    def plant() -> None:
        time.sleep(max(0.0, start + args.plant_at - time.time()))
        planted = _plant_refused(args, 0) if args.kind == "refused" else _plant_collision(args, set())
        _emit({"event": "plant", "n": 0, **planted})

    planter = threading.Thread(target=plant, daemon=True)
    planter.start()
    result = run_load(pod, args.rate, args.seconds, connections=2)
    planter.join(30)
    _emit({"event": "done", **result.to_json()})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/many", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    pod = sub.add_parser("_pod")
    for flag in ("--pod-ip", "--client-ip", "--pod-netns", "--kind"):
        pod.add_argument(flag, required=True)
    pod.add_argument("--rate", type=float, required=True)
    pod.add_argument("--seconds", type=float, required=True)
    pod.add_argument("--plant-at", type=float, required=True)
    parser.add_argument("--pods", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rate", type=float, default=40.0, help="packets/s of load a pod (default 40)")
    parser.add_argument("--margin", type=float, default=15.0,
                        help="seconds watch goes on capturing after the load ends, then SIGINT (default 15)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dissect", choices=("local", "pod"), default="local",
                        help="pass --dissect to watch (pod: a tshark an interface in each pod, not in watch's tree, "
                             "so not in the RSS and CPU measured here; default local)")
    parser.add_argument("--watch-exe", type=Path, default=VENV_BIN / "kubectl-meshdoctor")
    args = parser.parse_args(argv)
    if args.cmd == "_pod":
        return cmd_pod(args)
    try:
        results = run_bench(args)
    except BenchError as e:
        log(f"could not run: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 2
    print_table(results)
    lines, ok = verdict(results)
    for line in lines:
        print(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
