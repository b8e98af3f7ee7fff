"""CLI: drive one scenario against a lab pod from its client namespace, one JSON line per round on stdout; its
--help is the package docstring."""

from __future__ import annotations

import argparse
import signal
import sys

from meshdoctor_lab import scenarios
from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
from meshdoctor_lab.state import LabPod, LabPort

from .driver import DEFAULT_PERIOD, DEFAULT_ROUNDS, DEFAULT_SECONDS, drive
from .table import SCENARIOS


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m meshdoctor_lab.scenarios",
        description=scenarios.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--pod-ip", required=True)
    parser.add_argument("--client-ip", required=True)
    parser.add_argument("--pod-netns", required=True, help="for conntrack -F and nstat")
    parser.add_argument("--client-netns", default="", help="the namespace the driver runs in (where a caller sidecar's "
                                                           "admin port is)")
    parser.add_argument("--pod-name", help="pod name in the results (default: the scenario)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="time limit of the whole run")
    parser.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="seconds between round starts")
    parser.add_argument("--fix", default="", help="the printed fix applied to the pod (a client-side one changes "
                                                  "the round: lab/fixes.py CLIENT_FIXES)")
    parser.add_argument("--certs", default="", help="the pod's certificates (lab/pki.py): its callers' mTLS one")
    parser.add_argument("--caller", default="", choices=("", "sidecar"),
                        help="sidecar: this client's calls go through a caller sidecar (lab up --caller sidecar)")
    args = parser.parse_args(argv)
    pod = LabPod(
        name=args.pod_name or args.scenario,
        scenario=args.scenario,
        netns=args.pod_netns,
        client_netns=args.client_netns,
        pod_ip=args.pod_ip,
        client_ip=args.client_ip,
        ports=(LabPort("http", HTTP_PORT), LabPort("tcp-echo", ECHO_PORT)),
        uid="",
        fix=args.fix,
        certs=args.certs,
        caller=args.caller,
    )
    # `lab down` sends SIGTERM: unwind (finally blocks remove e.g. the syn-drop rule) instead of dying mid-round.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        drive(pod, args.scenario, rounds=args.rounds, seconds=args.seconds, period=args.period)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
