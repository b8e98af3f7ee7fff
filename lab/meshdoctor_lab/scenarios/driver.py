"""Running a scenario: one round (run_round, with the pod kernel's challenge-ACK count around it) and the bounded
loop of rounds (drive)."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Callable

from meshdoctor_lab.netns import in_netns
from meshdoctor_lab.state import LabPod

from .caller_rounds import downstream_idle_round, h2_round, http10_round, port_exhaustion_round, slow_app_round
from .healthy_rounds import healthy_mesh_round
from .invalid_rounds import conntrack_invalid_round
from .outbound_stale import outbound_stale_round
from .http_rounds import framing_round, healthy_http_round, refused_round, stale_keepalive_round
from .load import load_round
from .policy_rounds import (
    mtls_strict_round,
    no_route_round,
    outlier_round,
    overflow_round,
    tls_origination_round,
)
from .port_reuse import port_reuse_round
from .rounds import IO_TIMEOUT, RoundResult, Tally
from .server_first_rounds import server_first_round
from .table import SCENARIOS
from .tcp_rounds import healthy_round, syn_drop_round

DEFAULT_ROUNDS = 1500
DEFAULT_SECONDS = 3000.0  # keeps a forgotten lab's traffic under an hour
DEFAULT_PERIOD = 2.0  # seconds between round starts


def challenge_ack_count(pod_netns: str) -> int | None:
    """TcpExtTCPChallengeACK of the pod namespace's kernel (absolute), or None when nstat fails."""
    try:
        out = subprocess.run(
            in_netns(pod_netns, "nstat", "-azs", "TcpExtTCPChallengeACK"),
            capture_output=True, text=True, timeout=IO_TIMEOUT, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "TcpExtTCPChallengeACK":
            return int(fields[1])
    return None


_ROUNDS: dict[str, Callable[[LabPod, "Tally"], None]] = {
    "healthy": healthy_round,
    "healthy-http": healthy_http_round,
    "framing": framing_round,
    "stale-keepalive": stale_keepalive_round,
    "refused": refused_round,
    "refused-localhost": refused_round,
    "syn-drop": syn_drop_round,
    "load": load_round,
    "slow-app": slow_app_round,
    "http10": http10_round,
    "port-exhaustion": port_exhaustion_round,
    "downstream-idle": downstream_idle_round,
    "goaway": h2_round,
    "healthy-h2": h2_round,
    "no-sidecar": healthy_round,  # the app answers itself: nothing of Istio in the way
    "overflow": overflow_round,
    "outlier": outlier_round,
    "no-route": no_route_round,
    "mtls-strict": mtls_strict_round,
    "tls-to-plaintext": tls_origination_round,
    "healthy-strict": healthy_mesh_round,
    "healthy-strict-h2": healthy_mesh_round,
    "healthy-short": healthy_mesh_round,
    "conntrack-invalid": conntrack_invalid_round,
    "server-first": server_first_round,
    "outbound-stale": outbound_stale_round,
}


def run_round(pod: LabPod, scenario: str, *, used_ports: set[int] | None = None) -> RoundResult:
    """Run one round of `scenario` against `pod`. Must run inside pod.client_netns.

    Takes about 1-3 seconds (an outlier round up to OUTLIER_RECOVERY_WITHIN more, while a former ejection
    ends). Never raises for network failures (they land in RoundResult.errors); raises
    ValueError for an unknown scenario.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    ports = used_ports if used_ports is not None else set()
    started, t0 = time.time(), time.monotonic()
    acks_before = challenge_ack_count(pod.netns)
    tally = Tally()
    if scenario in _ROUNDS:
        _ROUNDS[scenario](pod, tally)
    else:
        port_reuse_round(pod, tally, flush=scenario == "collision", used_ports=ports)
    acks_after = challenge_ack_count(pod.netns)
    acks = None if acks_before is None or acks_after is None else acks_after - acks_before
    return RoundResult(
        scenario=scenario,
        pod=pod.name,
        started=started,
        duration_s=round(time.monotonic() - t0, 6),
        client_port=tally.client_port,
        http_ok=tally.http_ok,
        echo_ok=tally.echo_ok,
        second_connect_s=tally.second_connect_s,
        live_reset=tally.live_reset,
        challenge_acks=acks,
        errors=tuple(tally.errors),
        http=tuple(tally.http),
        connect_s=tally.connect_s,
        reused_after_s=tally.reused_after_s,
        load=tally.load,
    )


def drive(
    pod: LabPod,
    scenario: str,
    *,
    rounds: int = DEFAULT_ROUNDS,
    seconds: float = DEFAULT_SECONDS,
    period: float = DEFAULT_PERIOD,
    emit: Callable[[RoundResult], None] = lambda r: print(json.dumps(r.to_json()), flush=True),
) -> int:
    """Run at most `rounds` rounds, starting one every `period` seconds, for at most `seconds` seconds.

    Returns the number of rounds run. Raises ValueError for an unknown scenario.
    """
    deadline = time.monotonic() + seconds
    used_ports: set[int] = set()
    done = 0
    while done < rounds and time.monotonic() < deadline:
        round_start = time.monotonic()
        emit(run_round(pod, scenario, used_ports=used_ports))
        done += 1
        if len(used_ports) > 1000:  # TIME_WAIT is long gone for ports used this many rounds ago
            used_ports.clear()
        pause = min(period - (time.monotonic() - round_start), deadline - time.monotonic())
        if done < rounds and pause > 0:
            time.sleep(pause)
    return done
