"""What bench/live measures beside watch's report: CPU per process tree, the pod's packet rate, queued bytes.

The load and the pipeline share one machine, so a missed goal is read against the CPU each part used: the
traffic's side (load, app, sidecar), the lab API server's exec relay, tcpdump, tshark and watch itself.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from live_client import POD

class CpuMeter:
    """CPU seconds of named process trees between two snapshots (children that exit in between are lost)."""

    def __init__(self) -> None:
        self.before: dict[str, dict[int, float]] = {}
        self.after: dict[str, dict[int, float]] = {}
        self.t0 = 0.0
        self.machine0: dict[str, float] = {}
        self.everyone0: dict[int, tuple[str, float]] = {}

    @staticmethod
    def _tree(pids: list[int], recursive: bool) -> dict[int, float]:
        out = {}
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                for p in [proc, *(proc.children(recursive=True) if recursive else ())]:
                    try:
                        ct = p.cpu_times()
                        out[p.pid] = ct.user + ct.system
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
        return out

    @staticmethod
    def _machine() -> dict[str, float]:
        ct = psutil.cpu_times()
        return {"busy": ct.user + ct.nice + ct.system + ct.irq + ct.softirq, "softirq": ct.irq + ct.softirq,
                "steal": getattr(ct, "steal", 0.0)}

    @staticmethod
    def _everyone() -> dict[int, tuple[str, float]]:
        out = {}
        for p in psutil.process_iter(["name", "cpu_times"]):
            ct = p.info["cpu_times"]
            if ct is not None:
                out[p.pid] = (p.info["name"], ct.user + ct.system)
        return out

    def snapshot(self, groups: dict[str, list[int]]) -> dict[str, dict[int, float]]:
        # Only watch's tree is followed (its tshark children); the API server's children are the execs, whose
        # tcpdumps are a group of their own.
        return {name: self._tree(pids, name == "watch (python)") for name, pids in groups.items()}

    def start(self, groups: dict[str, list[int]]) -> None:
        self.before = self.snapshot(groups)
        self.t0 = time.monotonic()
        self.machine0 = self._machine()
        self.everyone0 = self._everyone()

    def stop(self, groups: dict[str, list[int]]) -> dict[str, Any]:
        self.after = after = self.snapshot(groups)
        wall = max(time.monotonic() - self.t0, 1e-9)
        cores = {}
        for name, now in after.items():
            was = self.before.get(name, {})
            used = sum(v - was.get(pid, 0.0) for pid, v in now.items())
            cores[name] = round(used / wall, 3)
        m1 = self._machine()
        machine = {k: round((m1[k] - self.machine0[k]) / wall, 3) for k in m1}
        ours = {pid for group in after.values() for pid in group}
        others: dict[str, float] = {}
        for pid, (name, t) in self._everyone().items():
            if pid not in ours:
                used = t - self.everyone0.get(pid, (name, 0.0))[1]
                if used > 0:
                    others[name] = others.get(name, 0.0) + used
        top = sorted(others.items(), key=lambda kv: -kv[1])[:6]
        return {"wall_s": round(wall, 3), "cores": cores, "machine_cores_busy": machine["busy"],
                "softirq_cores": machine["softirq"], "steal_cores": machine["steal"],
                "other_cores": round(machine["busy"] - sum(cores.values()), 3), "ncpu": psutil.cpu_count(),
                "other_processes": {name: round(t / wall, 3) for name, t in top}}


class Sampler:
    """Every second: the pod's packet counters and the bytes queued in the TCP connections between the lab's API
    server and watch (the exec streams' socket buffers: where a backlog waits when the pipeline lags)."""

    def __init__(self, pod_pid: int, api_port: int) -> None:
        self.pod_pid, self.api_port = pod_pid, api_port
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _packets(self) -> int | None:
        try:
            text = Path(f"/proc/{self.pod_pid}/net/dev").read_text()
        except OSError:
            return None
        total = 0
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            cols = rest.split()
            if name.strip() == "lo":
                total += int(cols[9])
            elif name.strip() == "eth0":
                total += int(cols[1]) + int(cols[9])
        return total

    def _queued(self) -> int | None:
        try:
            out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{self.api_port} or dport = "
                                  f":{self.api_port} )"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return sum(int(f[0]) + int(f[1]) for f in (line.split() for line in out.splitlines()) if len(f) >= 2)

    def _run(self) -> None:
        last = None
        while not self._stop.wait(1.0):
            now, packets = time.time(), self._packets()
            row = {"t": round(now, 3), "queued_bytes": self._queued()}
            if packets is not None and last is not None:
                row["pps"] = round((packets - last[1]) / (now - last[0]))
            if packets is not None:
                last = (now, packets)
            self.rows.append(row)


def process_groups(state, watch_pid: int) -> dict[str, list[int]]:
    from meshdoctor_lab import netns

    pod = state.pod(POD)
    groups: dict[str, list[int]] = {"watch (python)": [watch_pid]}
    tcpdumps, tsharks = [], []
    for pid in netns.netns_pids(pod.netns):
        try:
            name = psutil.Process(pid).name()
        except psutil.Error:
            continue
        if name == "tcpdump":
            tcpdumps.append(pid)
        elif "tshark" in name:  # watch --dissect pod: the debug container's, not the plugin's
            tsharks.append(pid)
    groups["tcpdump x2"] = tcpdumps
    if tsharks:
        groups["tshark in the pod"] = tsharks
    groups["lab API server"] = [state.pids["apiserver"]]
    groups["sidecar (Envoy)"] = [state.pids[f"{POD}/sidecar"]]
    groups["app (fast)"] = [state.pids[f"{POD}/app-http"]]
    return groups


def split_tshark(cpu: dict[str, Any], watch_pid: int, before: dict[int, float], after: dict[int, float]) -> None:
    """Separate the tshark children's CPU from watch's own Python process in `cpu` (same snapshot window)."""
    tshark = 0.0
    for pid, v in after.items():
        try:
            if pid != watch_pid and "tshark" in psutil.Process(pid).name():
                tshark += v - before.get(pid, 0.0)
        except psutil.Error:
            pass
    tshark_cores = round(tshark / cpu["wall_s"], 3)
    cpu["cores"]["tshark"] = tshark_cores  # one for both streams since the shared dissector
    cpu["cores"]["watch (python)"] = round(cpu["cores"]["watch (python)"] - tshark_cores, 3)
