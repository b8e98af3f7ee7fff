"""Record what real Envoy says in each lab scenario, for the parser and detector tests (tests/data/envoy-1.40).

For every scenario: a lab pod of it, Envoy's loggers raised to debug for the round (``POST /logging?level=debug``
on its admin port, put back to pilot-agent's ``warning`` and ``misc:error`` after), then, into OUT/SCENARIO/:

- ``istio-proxy.log``: the pod's istio-proxy container log over the round (its access log and Envoy's own log,
  as ``kubectl logs -c istio-proxy`` shows them), from after the loggers were raised until the log was quiet;
- ``stats-before.txt``, ``stats-after.txt``: ``GET /stats`` before and after the round;
- ``clusters.txt``: ``GET /clusters`` after it;
- ``round.json``: what the round's client saw (lab/scenarios/rounds.py RoundResult).

With ``--caller sidecar`` (tests/data/envoy-1.40-mesh) each pod is called through a caller sidecar
(lab/caller_sidecar.py) and both ends are recorded, the caller's into OUT/SCENARIO/caller/ and the pod's into
OUT/SCENARIO/server/, each with those files and tcpdump's ``lo.pcap`` and ``eth0.pcap`` of its network namespace
over the round (TCP, the admin port left out); ``round.json`` stays in OUT/SCENARIO/. A called pod without a sidecar
(tls-to-plaintext through a caller) has only its captures in OUT/SCENARIO/server/.

    sudo .venv/bin/python -m meshdoctor_lab.evidence tests/data/envoy-1.40 [--scenarios a,b] [--name N]
    sudo .venv/bin/python -m meshdoctor_lab.evidence tests/data/envoy-1.40-mesh --caller sidecar --scenarios ...

Needs root (the lab). Brings up its own lab (``--name``) with no drivers and takes it down at the end. Every wait
is bounded. A scenario whose log over one round is larger than ``--max-kb`` is refused (a round that grew).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from meshdoctor_lab import lab
from meshdoctor_lab.applied_fixes import injected
from meshdoctor_lab.captures import Interface, capturing
from meshdoctor_lab.scenarios.pod_admin import admin
from meshdoctor_lab.state import LabError, LabState

# The failure classes and the healthy HTTP pod the parser tests need lines of, in the order recorded.
SCENARIOS = ("overflow", "outlier", "no-route", "mtls-strict", "tls-to-plaintext", "stale-keepalive", "refused",
             "refused-localhost", "framing", "slow-app", "http10", "port-exhaustion", "downstream-idle", "goaway",
             "syn-drop", "collision", "healthy-http")
DEFAULT_NAME = "mdlabnew-evidence"
QUIET_S = 1.0  # seconds the log must not grow for the round to count as over
SETTLE_WITHIN_S = 20.0  # seconds a round's last lines get to arrive (downstream-idle's drain is 6.5 s)
DEFAULT_MAX_KB = 400


@dataclass(frozen=True)
class End:
    """One sidecar of a round: ``name`` (its directory under OUT/SCENARIO, "" for the pod's own when no caller
    sidecar runs), the network namespace its admin port and interfaces are in, and its log."""

    name: str
    netns: str
    log: Path
    sidecar: bool = True  # False: a pod without a sidecar (only its captures are recorded)


def ends(state: LabState, pod: str) -> tuple[End, ...]:
    """The pod's sidecar, and with a caller sidecar (``lab up --caller sidecar``) the caller's first; a called pod
    without a sidecar (its labels opt out of injection) is an End with ``sidecar`` False."""
    lab_pod = state.pod(pod)
    if not state.mesh.caller_sidecar:
        return (End("", lab_pod.netns, lab.access_log_path(state, pod)),)
    return (End("caller", lab_pod.client_netns, lab.caller_log_path(state, pod)),
            End("server", lab_pod.netns, lab.access_log_path(state, pod), injected(lab_pod.labels)))


def record_scenario(state: LabState, pod: str, out: Path, max_kb: int = DEFAULT_MAX_KB,
                    captures: bool | None = None) -> dict[str, int]:
    """Record one round of ``pod`` into ``out`` (module docstring), each sidecar's files in its End's directory;
    ``captures`` (default: with a caller sidecar) adds tcpdump's ``lo.pcap`` and ``eth0.pcap`` of each. Returns
    each file's size in bytes, by its path under ``out``.

    Raises LabError when Envoy's admin port does not answer, the round fails to run, a capture does not start, or
    a log exceeds ``max_kb`` KiB."""
    everyone = ends(state, pod)
    sides = tuple(side for side in everyone if side.sidecar)
    captures = state.mesh.caller_sidecar if captures is None else captures
    pcaps = {out / side.name / f"{iface}.pcap": Interface(side.netns, iface)
             for side in everyone for iface in ("lo", "eth0")} if captures else {}
    files: dict[Path, bytes] = {}
    try:
        for side in sides:
            admin(side.netns, "/logging?level=debug", "POST")
        try:
            before = {side: admin(side.netns, "/stats") for side in sides}
            time.sleep(QUIET_S)  # the admin requests' own debug lines land before the round's slice starts
            with capturing(pcaps):
                start = {side: side.log.stat().st_size for side in sides}
                result = lab.trigger_round(state, pod)
                stop = {side: _quiet_end(side.log) for side in sides}
            for side in sides:
                files[Path(side.name, "stats-before.txt")] = before[side].encode()
                files[Path(side.name, "stats-after.txt")] = admin(side.netns, "/stats").encode()
                files[Path(side.name, "clusters.txt")] = admin(side.netns, "/clusters").encode()
        finally:
            for side in sides:
                admin(side.netns, "/logging?level=warning", "POST")
                admin(side.netns, "/logging?misc=error", "POST")
    except OSError as exc:
        raise LabError(f"{pod}: Envoy's admin port: {exc}") from None
    for side in sides:
        with open(side.log, "rb") as f:
            f.seek(start[side])
            text = f.read(stop[side] - start[side])
        if len(text) > max_kb * 1024:
            raise LabError(f"{pod}: {len(text) // 1024} KiB of {side.name or 'sidecar'} log for one round (more "
                           f"than {max_kb})")
        files[Path(side.name, "istio-proxy.log")] = text
    files[Path("round.json")] = (json.dumps(result.to_json(), indent=1) + "\n").encode()
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    sizes = {str(name): len(data) for name, data in files.items()}
    sizes.update({str(pcap.relative_to(out)): pcap.stat().st_size for pcap in pcaps})
    return sizes


def _quiet_end(log: Path) -> int:
    """The log's size once it has not grown for QUIET_S seconds (at most SETTLE_WITHIN_S)."""
    deadline = time.monotonic() + SETTLE_WITHIN_S
    size, since = log.stat().st_size, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = log.stat().st_size
        if now != size:
            size, since = now, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            break
    return size


def record(out: Path, scenarios: tuple[str, ...] = SCENARIOS, name: str = DEFAULT_NAME,
           max_kb: int = DEFAULT_MAX_KB, mesh: lab.MeshOptions = lab.MeshOptions()) -> dict[str, dict[str, int]]:
    """Bring up a lab of ``scenarios`` with ``mesh``, record each (record_scenario) into ``out``/SCENARIO, take the
    lab down. Returns the sizes written. Raises LabError."""
    state = lab.up(name, None, scenarios, drivers=False, apiserver=False, mesh=mesh)
    try:
        return {pod: record_scenario(state, pod, out / pod, max_kb) for pod in scenarios}
    finally:
        lab.down(state.state_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshdoctor_lab.evidence", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="directory to write SCENARIO/... into")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"the lab's name (default {DEFAULT_NAME})")
    parser.add_argument("--max-kb", type=int, default=DEFAULT_MAX_KB, help="largest log of one round, KiB")
    parser.add_argument("--caller", choices=("none", "sidecar"), default="none",
                        help="sidecar: each pod called through a caller sidecar (Istio mTLS), both ends recorded "
                             "into SCENARIO/caller and SCENARIO/server with tcpdump's lo.pcap and eth0.pcap")
    parser.add_argument("--caller-retry-503", action="store_true",
                        help="the caller sidecar retries 503 (Istio < 1.24's default retry policy)")
    args = parser.parse_args(argv)
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    mesh = lab.MeshOptions(caller=args.caller, caller_retry_503=args.caller_retry_503)
    try:
        sizes = record(args.out, scenarios, args.name, args.max_kb, mesh)
    except LabError as exc:
        print(f"record-envoy-evidence: {exc}", file=sys.stderr)
        return 2
    for pod, files in sizes.items():
        print(f"{pod}: " + ", ".join(f"{n} {b} B" for n, b in files.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
