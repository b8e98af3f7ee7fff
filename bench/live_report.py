"""bench/live's verdict: watch's report and finding lines matched to the planted failures, goals, the table.

A planted failure counts as found when a finding of its detector names its flow; its latency runs from the
finding's ts (the deciding packet's capture time) to the moment watch's line for it arrived on the terminal.
"""

from __future__ import annotations

import re
from typing import Any

from live_client import POD
from live_procs import Line

GOAL_P99_S = 1.0
GOAL_RATE_FRACTION = 0.9
# Issue 17: CPU of the plugin side (tshark and watch's own process, summed) per packet that crossed the exec
# stream, at 10,000 packets/s; the lab API server's relay is reported apart (in a cluster it is the API server).
GOAL_PLUGIN_US = 50.0
# watch's live line: FlowRef.text(labelled=False) in parentheses, "CLIENT -> SERVER on IFACE" or, from Envoy's
# logs, "CLIENT -> SERVER (from Envoy's logs)" (core/findings.py).
FINDING = re.compile(r"^(error|warning|info): ([\w.-]+): (.*) \((\S+) -> (\S+)(?: on \S+| \(from Envoy's logs\))\)$")


def _percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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


def summarise(args, done: dict, plants: list[dict], report: dict, lines: list[Line], cpu: dict) -> dict:
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
    crossed = sum(v["captured"] or 0 for v in ifaces.values())
    cores = cpu.get("cores", {})
    plugin_s = (cores.get("tshark", 0.0) + cores.get("watch (python)", 0.0)) * cpu.get("wall_s", 0.0)
    relay_s = cores.get("lab API server", 0.0) * cpu.get("wall_s", 0.0)
    pod_tshark_s = cores.get("tshark in the pod", 0.0) * cpu.get("wall_s", 0.0)
    per_packet = {"crossing_packets": crossed,
                  "plugin_us": round(plugin_s / crossed * 1e6, 1) if crossed else None,
                  "relay_us": round(relay_s / crossed * 1e6, 1) if crossed else None,
                  "pod_tshark_us": round(pod_tshark_s / crossed * 1e6, 1) if crossed and pod_tshark_s else None}
    goals = {
        "rate": achieved is not None and achieved >= GOAL_RATE_FRACTION * args.rate,
        "plugin_cpu": per_packet["plugin_us"] is not None and per_packet["plugin_us"] <= GOAL_PLUGIN_US,
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
        "per_crossing_packet": per_packet,
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
    pp = res["per_crossing_packet"]
    out.append(f"  per crossing packet ({pp['crossing_packets']}): plugin side (tshark + watch) "
               f"{_fmt(pp['plugin_us'])} us (goal at most {GOAL_PLUGIN_US:g} us)   [{mark[goals['plugin_cpu']]}]; "
               f"the lab API server's relay, apart: {_fmt(pp['relay_us'])} us"
               + (f"; tshark in the pod (--dissect pod), apart: {_fmt(pp['pod_tshark_us'])} us"
                  if pp.get("pod_tshark_us") is not None else ""))
    for name, met in goals.items():
        out.append(f"  {'PASS' if met else 'FAIL'}: {name}")
    out.append(f"  watch exit {res.get('watch_exit')}; result: {'all goals met' if res['ok'] else 'GOAL MISSED'}")
    print("\n".join(out), flush=True)
