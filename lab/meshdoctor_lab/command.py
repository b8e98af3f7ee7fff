"""`kubectl meshdoctor lab up|down|status`: the pod lab's command, registered in the product's command
entry-point group (``kubectl_meshdoctor.commands``, lab/pyproject.toml). The product imports nothing of the lab:
this module gives it the command's ``help``, ``add_arguments`` and ``run``."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from kubectl_meshdoctor.commands.console import error

help = "a local pod lab (network namespaces, Istio's nat rules, real failures)"  # noqa: A001 (the protocol's name)

# sudo's secure_path drops the PATH entry a venv or krew put the plugin on: `sudo kubectl meshdoctor` finds no
# plugin, so the examples give sudo the plugin's own path.
LAB_UP_EXAMPLES = """\
examples:
  sudo "$(command -v kubectl-meshdoctor)" lab up --pods collision,healthy
  sudo "$(command -v kubectl-meshdoctor)" lab up \\
      --pods collision,fixed=collision --fix fixed=tproxy
"""

LAB_EPILOG = """\
examples (the lab needs root; sudo would not find the plugin by its name, so give it the path):
  sudo "$(command -v kubectl-meshdoctor)" lab up
  sudo "$(command -v kubectl-meshdoctor)" lab status
  sudo "$(command -v kubectl-meshdoctor)" lab down
"""



def run(args) -> int:
    """`kubectl meshdoctor lab up|down|status`. Without the lab's dependencies: one line saying what to
    install, exit 2."""
    try:
        from meshdoctor_lab import lab
        from meshdoctor_lab.applied_fixes import injected as lab_injected
        from meshdoctor_lab.state import LabError, caller_pod_name
    except ModuleNotFoundError as e:  # the lab's own dependencies (psutil, aiohttp), installed with it
        return error(f"the lab cannot run without the module {e.name}: from the repository, pip install ./lab "
                     f"(or scripts/install)")

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", args.name):
        return error(f'lab name "{args.name}" must be a Kubernetes namespace name (lower case letters, digits, -)')
    state_dir = args.state_dir or lab.default_state_dir(args.name)
    try:
        if args.lab_command == "up":
            pods = [p.strip() for p in args.pods.split(",") if p.strip()]
            try:
                fixes = _fixes(lab, pods, args.fix or [])
            except KeyError as e:
                return error(e.args[0])
            fixed = f", fix {', '.join(args.fix)}" if args.fix else ""
            mesh = lab.MeshOptions(access_log_encoding=args.access_log.upper(), legacy_inbound=args.legacy_inbound,
                                   caller=args.caller, caller_retry_503=args.caller_retry_503)
            state = lab.up(args.name, state_dir, pods, mesh=mesh, fixes=fixes, on_start=lambda _: sys.stderr.write(
                f"creating lab {args.name} with pods {', '.join(pods)}{fixed} ...\n"))
            meshed = [p.name for p in state.pods if lab_injected(p.labels)]
            callers = [caller_pod_name(name) for name in meshed] if state.mesh.caller_sidecar else []
            print(f"lab {state.name} is up: pods {', '.join([p.name for p in state.pods] + callers)} in namespace "
                  f"{state.namespace}")
            print(f"kubeconfig: {state.kubeconfig}")
            hints = [f"watch pod/{name}" for name in meshed] or [f"lint pod/{state.pods[0].name}"]  # watch: a sidecar
            if callers:  # both hops of each request: where the 503 is seen, and why
                hints = [f"watch pod/{caller} pod/{name}" for caller, name in zip(callers, meshed)]
            for hint in hints:
                print(f"try:  {_ourselves()} {hint} --kubeconfig {state.kubeconfig}")
        elif args.lab_command == "down":
            if not (Path(state_dir) / "state.json").exists():  # idempotent, as kubectl delete --ignore-not-found
                print(f"no lab in {state_dir}: nothing to take down")
                return 0
            lab.down(state_dir)
            print(f"lab in {state_dir} is down")
        else:
            state = lab.status(state_dir)
            if state is None:
                print(f"no lab in {state_dir}")
                return 0
            print(describe_lab(state))
            obs = state.observed
            return 0 if obs is None or (not obs.dead and not obs.netns_missing) else 1
    except LabError as e:
        return error(str(e))
    return 0


def _fixes(lab, pods: list[str], given: list[str]) -> dict | None:
    """``--fix`` values (NAME for every pod, POD=NAME for one) -> pod name -> the fix as the lab is given it.
    Raises KeyError with the message for a fix a pod's scenario does not print (or an unknown pod)."""
    if not given:
        return None
    from meshdoctor_lab.scenario_fixes import lab_fix
    from meshdoctor_lab.scenarios import SCENARIOS

    scenario_of = dict(map(lab.pod_spec, pods))
    every = {v for v in given if "=" not in v}
    if len(every) > 1:
        raise KeyError(f"--fix {' and --fix '.join(sorted(every))}: a lab pod takes one fix; give a pod its own "
                       f"with --fix POD=NAME")
    chosen: dict[str, str] = dict.fromkeys(scenario_of, next(iter(every))) if every else {}
    own: dict[str, str] = {}
    for value in given:
        pod, sep, name = value.partition("=")
        if not sep:
            continue
        if pod not in scenario_of:
            raise KeyError(f"--fix {value}: no pod {pod} in --pods ({', '.join(scenario_of)})")
        if own.get(pod, name) != name:  # one fix a pod, as one change is proven at a time
            spec = pod if scenario_of[pod] == pod else f"{pod}={scenario_of[pod]}"
            raise KeyError(f"pod {pod} is given two fixes ({own[pod]}, {name}): a lab pod takes one; run another "
                           f"pod of its scenario for the other (--pods {spec},{pod}-2={scenario_of[pod]} --fix "
                           f"{pod}-2={name})")
        own[pod] = chosen[pod] = name  # a pod's own fix overrides the one for every pod
    # An unknown scenario is lab.up's to name; its fixes are not looked up.
    return {pod: lab_fix(scenario_of[pod], name) for pod, name in chosen.items() if scenario_of[pod] in SCENARIOS}


def describe_lab(state) -> str:
    obs = state.observed
    lines = [f"lab {state.name}: namespace {state.namespace}, kubeconfig {state.kubeconfig}",
             f"  sidecars: Envoy, access log {state.mesh.access_log_encoding}, inbound dialled "
             + ("on 127.0.0.1 (Istio < 1.10)" if state.mesh.legacy_inbound else "from 127.0.0.6 (Istio >= 1.10)")
             + ("; under TPROXY from the client's address" if any(
                 v.upper() == "TPROXY" for p in state.pods for _, v in p.annotations) else "")
             + _callers(state.mesh)]
    for pod in state.pods:
        lines.append(f"  pod/{pod.name}  {pod.pod_ip}  client {pod.client_ip}  netns {pod.netns}  "
                     f"scenario {pod.scenario}" + (f"  fix {pod.fix}" if pod.fix else ""))
    if obs is not None:
        lines.append(f"  processes running: {', '.join(obs.running) or 'none'}")
        if obs.dead:
            lines.append(f"  processes dead: {', '.join(obs.dead)} (see the logs in {state.state_dir})")
        if obs.netns_missing:
            lines.append(f"  network namespaces missing: {', '.join(obs.netns_missing)}")
    return "\n".join(lines)


def _callers(mesh) -> str:
    if not mesh.caller_sidecar:
        return ""
    return "; called through caller sidecars (Istio mTLS" + (", 503s retried)" if mesh.caller_retry_503 else ")")


def _ourselves() -> str:
    """How to run this plugin again: `kubectl meshdoctor` when kubectl would find this very executable on PATH,
    else the executable's own path (a venv's bin, as scripts/install makes, is rarely on PATH)."""
    found = shutil.which("kubectl-meshdoctor")
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if found and shutil.which("kubectl") and os.path.realpath(found) == me:
        return "kubectl meshdoctor"
    return me if me.endswith("kubectl-meshdoctor") else f"{sys.executable} -m kubectl_meshdoctor"


def _scenarios_help() -> str:
    """`lab up --help`'s list of scenarios and the fixes each prints (what --pods and --fix take)."""
    try:
        from meshdoctor_lab.scenario_fixes import fix_names
        from meshdoctor_lab.scenarios.table import SCENARIOS
    except ImportError:  # a dependency of the lab is missing: lab up says so when run
        return ""
    lines = ["scenarios (--pods NAME or POD=NAME) and the fixes their findings print, or the lab's own where no "
             "finding prints one yet (--fix NAME):"]
    width = max(map(len, SCENARIOS))
    for scenario in SCENARIOS:
        names = ", ".join(fix_names(scenario)) or "-"
        lines.append(f"  {scenario:<{width}}  {names}")
    return "\n".join(lines) + "\n"


def add_arguments(lab: argparse.ArgumentParser) -> None:
    """The lab's flags and actions, on the parser the CLI made for `lab`."""
    lab.description = ("Manage the pod lab: real kernel TCP and iptables in network namespaces, "
                       "real Envoy as each pod's istio-proxy (configured as Istio configures a sidecar), and a test "
                       "API server that the plugin and kubectl talk to through the kubeconfig `lab up` prints. "
                       "Needs root.")
    lab.epilog = LAB_EPILOG
    # The CLI's own parser class (one-line errors, an epilog built on --help) for the actions too.
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="ACTION", parser_class=type(lab), required=True)
    for name, text in (("up", "create the lab and print its kubeconfig"), ("down", "remove the lab"),
                       ("status", "show the lab's pods and processes")):
        lp = lab_sub.add_parser(name, help=text, description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
        lp.add_argument("--name", default="meshdoctor-lab", help="lab name, also its namespace "
                        "(default meshdoctor-lab)")
        lp.add_argument("--state-dir", type=Path, help="where the lab keeps its state "
                        "(default /run/kubectl-meshdoctor/NAME)")
        if name == "up":
            lp.epilog_of = lambda: _scenarios_help() + "\n" + LAB_UP_EXAMPLES
            lp.add_argument("--pods", default="collision,healthy",
                            help="comma-separated scenario pods to create, NAME=SCENARIO for several of one kind "
                                 "(default collision,healthy; the scenarios are listed below)")
            lp.add_argument("--access-log", choices=("text", "json"), default="text",
                            help="the sidecars' access-log encoding, as Istio's meshConfig.accessLogEncoding "
                                 "(default text: Istio's default TEXT format)")
            lp.add_argument("--legacy-inbound", action="store_true",
                            help="the sidecars dial the app on 127.0.0.1, as Istio before 1.10 did (newer Istio "
                                 "dials the pod IP from 127.0.0.6, which an app bound to 127.0.0.1 refuses)")
            lp.add_argument("--caller", choices=("none", "sidecar"), default="none",
                            help="who calls each pod: none (its scenario's client, in plaintext; the default) or "
                                 "sidecar (that client through a caller sidecar, real Envoy as Istio renders a "
                                 "sidecar's outbound side, speaking Istio mTLS to the pod's sidecar; served as "
                                 "pod POD-caller)")
            lp.add_argument("--caller-retry-503", action="store_true",
                            help="the caller sidecar's default retry policy also retries 503, as Istio before 1.24 "
                                 "did (or 1.24-1.26 with EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY=false)")
            lp.add_argument("--fix", action="append", metavar="[POD=]NAME",
                            help="apply this printed fix (a finding's fixes[].name; README's detector table "
                                 "names each class's first) as Istio would render it, to see the failure gone: "
                                 "NAME for every pod in --pods (each must print it), POD=NAME for one (it overrides "
                                 "NAME there); one fix a pod; repeatable "
                                 "(e.g. --pods collision,fixed=collision --fix fixed=tproxy)")
