"""Record what real Envoy says in each lab scenario, for the parser and detector tests (tests/data/envoy-1.40).

For every scenario: a lab pod of it, Envoy's loggers raised to debug for the round (``POST /logging?level=debug``
on its admin port, put back to pilot-agent's ``warning`` and ``misc:error`` after), then, into OUT/SCENARIO/:

- ``istio-proxy.log``: the pod's istio-proxy container log over the round (its access log and Envoy's own log,
  as ``kubectl logs -c istio-proxy`` shows them), from after the loggers were raised until the log was quiet;
- ``stats-before.txt``, ``stats-after.txt``: ``GET /stats`` before and after the round;
- ``clusters.txt``: ``GET /clusters`` after it;
- ``round.json``: what the round's client saw (lab/scenarios/rounds.py RoundResult).

    sudo .venv/bin/python -m meshdoctor_lab.evidence tests/data/envoy-1.40 [--scenarios a,b] [--name N]

Needs root (the lab). Brings up its own lab (``--name``) with no drivers and takes it down at the end. Every wait
is bounded. A scenario whose log over one round is larger than ``--max-kb`` is refused (a round that grew).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from meshdoctor_lab import lab
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


def record_scenario(state: LabState, pod: str, out: Path, max_kb: int = DEFAULT_MAX_KB) -> dict[str, int]:
    """Record one round of ``pod`` into ``out`` (module docstring); returns each file's size in bytes.

    Raises LabError when Envoy's admin port does not answer, the round fails to run, or its log exceeds
    ``max_kb`` KiB."""
    netns = state.pod(pod).netns
    log = lab.access_log_path(state, pod)
    try:
        admin(netns, "/logging?level=debug", "POST")
        try:
            before = admin(netns, "/stats")
            time.sleep(QUIET_S)  # the admin requests' own debug lines land before the round's slice starts
            start = log.stat().st_size
            result = lab.trigger_round(state, pod)
            end = _quiet_end(log)
            after = admin(netns, "/stats")
            clusters = admin(netns, "/clusters")
        finally:
            admin(netns, "/logging?level=warning", "POST")
            admin(netns, "/logging?misc=error", "POST")
    except OSError as exc:
        raise LabError(f"{pod}: Envoy's admin port: {exc}") from None
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read(end - start)
    if len(text) > max_kb * 1024:
        raise LabError(f"{pod}: {len(text) // 1024} KiB of log for one round (more than {max_kb})")
    out.mkdir(parents=True, exist_ok=True)
    files = {"istio-proxy.log": text, "stats-before.txt": before.encode(), "stats-after.txt": after.encode(),
             "clusters.txt": clusters.encode(),
             "round.json": (json.dumps(result.to_json(), indent=1) + "\n").encode()}
    for name, data in files.items():
        (out / name).write_bytes(data)
    return {name: len(data) for name, data in files.items()}


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
           max_kb: int = DEFAULT_MAX_KB) -> dict[str, dict[str, int]]:
    """Bring up a lab of ``scenarios``, record each (record_scenario) into ``out``/SCENARIO, take the lab down.
    Returns the sizes written. Raises LabError."""
    state = lab.up(name, None, scenarios, drivers=False, apiserver=False)
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
    args = parser.parse_args(argv)
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    try:
        sizes = record(args.out, scenarios, args.name, args.max_kb)
    except LabError as exc:
        print(f"record-envoy-evidence: {exc}", file=sys.stderr)
        return 2
    for pod, files in sizes.items():
        print(f"{pod}: " + ", ".join(f"{n} {b} B" for n, b in files.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
