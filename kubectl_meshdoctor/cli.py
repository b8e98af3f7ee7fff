"""``kubectl meshdoctor``: the command line front end. Parses flags, runs the core, maps errors to exit codes.

Exit codes (DESIGN.md): 0 no error finding, 1 at least one error finding, 2 usage or input error (one line on
stderr, never a traceback; set MESHDOCTOR_DEBUG=1 to see one for an internal error), or a watch that captured
nothing on any interface and found no error (its report is printed, its problems say why).
"""

from __future__ import annotations

import signal

# A Ctrl-C while Python is still importing should just end the program, not print an import traceback;
# main() installs the usual KeyboardInterrupt handling once it runs.
signal.signal(signal.SIGINT, signal.SIG_DFL)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from . import __version__
from .report import EXIT_USAGE, RENDERERS

PROG = "kubectl meshdoctor"
EXIT_CODES_HELP = """\
exit codes: 0 no error finding, 1 at least one error finding, 2 usage or input error (one line on stderr), or
a watch where no interface captured anything and nothing else found an error (the report is printed; its
problems say why)
"""

EPILOG_MAIN = """\
examples:
  kubectl meshdoctor watch pod/reviews-v1-7d9 -n shop
  kubectl meshdoctor watch deploy/reviews -n shop --no-tui --duration 120 -o json > report.json
  kubectl meshdoctor analyze lo.pcap eth0.pcapng -o json
  sudo kubectl meshdoctor lab up          # a local pod lab with real failures, and its kubeconfig

""" + EXIT_CODES_HELP

EPILOG_WATCH = """\
watch adds (or reuses) an ephemeral container meshdoctor-* targeting istio-proxy, runs tcpdump on the pod's
lo and eth0, and runs every detector live. Ephemeral containers cannot be removed; the container's command is a
bounded sleep (--ttl), and the tcpdumps end when watch ends.

examples:
  kubectl meshdoctor watch pod/reviews-v1-7d9 -n shop
  kubectl meshdoctor watch deploy/reviews --context prod --no-tui --duration 60 -o text
  kubectl meshdoctor watch pod/collision --kubeconfig /run/kubectl-meshdoctor/meshdoctor-lab/kubeconfig

""" + EXIT_CODES_HELP

EPILOG_ANALYZE = """\
The interface of each file comes from FILE:IFACE, else pcapng interface blocks, else the file's stem
(lo.pcap -> lo). Frame numbers in the report are the frame numbers Wireshark shows for that file.
tshark yields only the packets a detector can act on (SYN, FIN, RST, HTTP/1 message starts, challenge-ACK
candidates); the packet counts are of those.

examples:
  kubectl meshdoctor analyze lo.pcap eth0.pcap
  kubectl meshdoctor analyze capture.pcapng:eth0 -o json
  kubectl meshdoctor analyze lo.pcap eth0.pcap --tui    # browse findings, ladder diagrams and packets
"""


EPILOG_LOGLEVEL = """\
examples:
  kubectl meshdoctor log-level pod/reviews-v1-7d9                       # show the levels
  kubectl meshdoctor log-level pod/reviews-v1-7d9 --level connection:debug,http:debug
  kubectl meshdoctor log-level deploy/reviews --level debug
  kubectl meshdoctor log-level -l app=reviews -r                         # back to Istio's defaults

A bad level or an unknown logger exits 2 before any proxy is changed and names the valid ones.
"""


EPILOG_LINT = """\
examples:
  kubectl meshdoctor lint pod/reviews-v1-7d9 -n shop
  kubectl meshdoctor lint deploy/reviews -o markdown
  kubectl meshdoctor lint -l app=reviews -o json
  kubectl meshdoctor lint -A                     # every pod you can list

rules: redirect-exposure, probe-port, restart-loop, no-sidecar, sidecar-not-ready, hold-application,
probe-not-rewritten, excluded-port-exposed; exit 1 when any finding is an error.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, like kubectl
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see --help)\n")


def _kube_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (as kubectl)")
    g.add_argument("-n", "--namespace", help="namespace of the target (default: the context's, else default)")
    g.add_argument("--context", help="kubeconfig context to use (default: current-context)")
    g.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    g.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="timeout of each API request (default 30)")


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=sorted(RENDERERS), default="text",
                   help="report format (default text); json is the stable schema, markdown for tickets")
    p.add_argument("--no-redact", dest="redact", action="store_false",
                   help="show authorization, cookie, set-cookie, proxy-authorization and x-api-key values "
                        "(hidden by default: reports get shared)")


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return v


def _count(text: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Find why an Istio mesh answers 502/503: capture a pod's lo and eth0, "
                "detect four-tuple collisions and other failures, and explain the Envoy response flags.",
                epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kubectl-meshdoctor {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    w = sub.add_parser("watch", help="capture a pod live and show findings (TUI, or a report with --no-tui)",
                       description="Capture a pod's lo and eth0 live and run every detector.",
                       epilog=EPILOG_WATCH, formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("target", nargs="?", metavar="pod/NAME|deploy/NAME",
                   help="what to capture (a bare NAME is a pod); deploy/NAME captures every pod of it")
    w.add_argument("-l", "--selector", help="capture every running pod with these labels (at most 50)")
    _kube_flags(w)
    w.add_argument("--no-tui", action="store_true", help="no screen: print a report at the end (the default "
                   "when stdout or stdin is not a terminal)")
    w.add_argument("--duration", type=_positive, metavar="SECONDS",
                   help="stop after this many seconds (default: until q / Ctrl-C)")
    _output_flag(w)
    w.add_argument("--image", default=None, help="debug container image with tcpdump "
                   "(default docker.io/nicolaka/netshoot:v0.13)")
    w.add_argument("--ttl", type=_positive, default=3600, metavar="SECONDS",
                   help="the debug container's sleep: it ends by itself after this (default 3600)")
    w.add_argument("--iface", default="lo,eth0", metavar="LIST",
                   help="the pod's interfaces to capture, comma-separated (default lo,eth0)")
    w.add_argument("--proxy-admin-port", type=int, default=15000, metavar="PORT",
                   help="the sidecar's Envoy admin port, for counters (default 15000)")
    w.add_argument("-v", "--verbose", action="store_true",
                   help="progress lines on stderr even when it is not a terminal (e.g. \"capturing ...\")")
    w.add_argument("--start-timeout", type=_positive, default=120, metavar="SECONDS",
                   help="how long the debug container may take to start, e.g. pulling its image (default 120)")
    w.add_argument("--profile", choices=("least", "netadmin"), default="least",
                   help="debug container capabilities: least = NET_RAW only (default), netadmin = NET_ADMIN too")
    w.add_argument("--dry-run", action="store_true",
                   help="print the ephemeral container watch would add and the RBAC it needs; change nothing")
    w.add_argument("--write-pcap", type=Path, metavar="DIR",
                   help="also save the lo and eth0 captures in DIR, as captured (add --full-capture for every "
                   "TCP packet; they carry secrets: only on request)")
    w.add_argument("--full-capture", action="store_true",
                   help="capture every TCP packet; by default tcpdump in the pod keeps what a detector reads "
                   "(SYN/FIN/RST, HTTP/1 message starts on lo, pure ACKs on eth0), which keeps up with busier pods")

    ll = sub.add_parser("log-level", help="show or change the sidecars' Envoy log levels (like istioctl "
                        "proxy-config log)", description="Show or change Envoy log levels of the sidecar of "
                        "a pod, of every pod of a deployment, or of every pod matching -l. Compatible with "
                        "istioctl proxy-config log.", epilog=EPILOG_LOGLEVEL,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ll.add_argument("target", nargs="?", metavar="pod/NAME|deploy/NAME", help="whose sidecar (or use -l)")
    ll.add_argument("-l", "--selector", help="every running pod with these labels, e.g. app=reviews")
    _kube_flags(ll)
    what = ll.add_mutually_exclusive_group()
    what.add_argument("--level", metavar="SPEC", help="debug (every logger), or http:debug,connection:trace "
                      "(':' or '='); levels: trace debug info warning error critical off")
    what.add_argument("-r", "--reset", action="store_true",
                      help="back to Istio's defaults: every logger warning, misc error")
    ll.add_argument("--proxy-admin-port", type=int, default=15000, metavar="PORT",
                    help="Envoy admin port in the pod (default 15000)")
    ll.add_argument("-o", "--output", choices=("text", "json"), default="text", help="text table or json")

    li = sub.add_parser("lint", help="check pods' Istio set-up from their spec alone (redirect map, probes, "
                        "restarts, sidecar)", description="Check pods from their spec and status alone: which "
                        "ports share Istio's inbound listener, probes on undeclared ports, restart loops, a "
                        "missing or unready sidecar, start-up before the proxy. Changes nothing.",
                        epilog=EPILOG_LINT, formatter_class=argparse.RawDescriptionHelpFormatter)
    li.add_argument("target", nargs="?", metavar="pod/NAME|deploy/NAME", help="what to check (or use -l / -A)")
    li.add_argument("-l", "--selector", help="every pod with these labels")
    li.add_argument("-A", "--all-namespaces", action="store_true", help="every pod of every namespace")
    _kube_flags(li)
    _output_flag(li)

    a = sub.add_parser("analyze", help="run the detectors on pcap/pcapng files",
                       description="Run the detectors on capture files (tcpdump, ksniff, Wireshark).",
                       epilog=EPILOG_ANALYZE, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("files", nargs="+", metavar="FILE[:IFACE]")
    a.add_argument("--tui", action="store_true", help="open the findings in the TUI (ladder diagrams, packets "
                   "pane, s saves a finding's packets); the report is printed when you quit")
    a.add_argument("-j", "--jobs", type=_count, default=None, metavar="N",
                   help="tshark processes at once (default 1: each holds ~160 MB; 2 reads two files ~10%% faster "
                   "on two cores)")
    _output_flag(a)

    lab = sub.add_parser("lab", help="a local pod lab (network namespaces, Istio's nat rules, real failures)",
                         description="Manage the pod lab: real kernel TCP and iptables in network namespaces, "
                         "real Envoy as each pod's istio-proxy (configured as Istio configures a sidecar), and a test "
                         "API server that the plugin and kubectl talk to through the kubeconfig `lab up` prints. "
                         "Needs root.",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="examples:\n  sudo kubectl meshdoctor lab up\n"
                                "  sudo kubectl meshdoctor lab status\n  sudo kubectl meshdoctor lab down\n")
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="ACTION", parser_class=_Parser, required=True)
    for name, text in (("up", "create the lab and print its kubeconfig"), ("down", "remove the lab"),
                       ("status", "show the lab's pods and processes")):
        lp = lab_sub.add_parser(name, help=text, description=text)
        lp.add_argument("--name", default="meshdoctor-lab", help="lab name, also its namespace "
                        "(default meshdoctor-lab)")
        lp.add_argument("--state-dir", type=Path, help="where the lab keeps its state "
                        "(default /run/kubectl-meshdoctor/NAME)")
        if name == "up":
            lp.add_argument("--pods", default="collision,healthy",
                            help="comma-separated scenario pods to create, NAME=SCENARIO for several of one kind (default collision,healthy)")
            lp.add_argument("--access-log", choices=("text", "json"), default="text",
                            help="the sidecars' access-log encoding, as Istio's meshConfig.accessLogEncoding "
                                 "(default text: Istio's default TEXT format)")
            lp.add_argument("--legacy-inbound", action="store_true",
                            help="the sidecars dial the app on 127.0.0.1, as Istio before 1.10 did (newer Istio "
                                 "dials the pod IP from 127.0.0.6, which an app bound to 127.0.0.1 refuses)")
    return p


def _err(message: str) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return EXIT_USAGE


async def _progress_line(pipelines, label: str, every_s: float = 1.0) -> None:
    """Rewrite one status line on a terminal's stderr every ``every_s`` seconds until cancelled; ``pipelines``
    is one Pipeline or a list that may grow (one per pod)."""
    if not sys.stderr.isatty():
        return
    try:
        while True:
            await asyncio.sleep(every_s)
            group = pipelines if isinstance(pipelines, list) else [pipelines]
            packets = sum(p.stats.packets for p in group)
            findings = sum(len(p.findings) for p in group)
            per_iface = ", ".join(f"{k} {v.packets}" for k, v in sorted(group[0].stats.by_iface.items())) \
                if len(group) == 1 else f"{len(group)} pods"
            sys.stderr.write(f"\r{label}: {packets} packets analysed ({per_iface}), {findings} findings ")
            sys.stderr.flush()
    finally:
        sys.stderr.write("\r\033[K")


def _cmd_analyze(args) -> int:
    from .analyze import CaptureArg, InputError, analyze
    from .pipeline import Pipeline

    captures = list(dict.fromkeys(CaptureArg.parse(f) for f in args.files))  # a file given twice counts once
    if args.tui:
        from .analyze import check_capture
        from .tui.run import file_session, run_session

        try:
            for c in captures:
                check_capture(c.path)
        except InputError as e:
            return _err(str(e))
        if not (sys.stdout.isatty() and sys.stdin.isatty()):
            return _err("--tui needs a terminal (drop --tui to print the report)")
        return run_session(file_session(captures, args.redact, args.jobs), args.output)

    stopped_by: list[int] = []

    async def run():
        # Ctrl-C, SIGTERM and SIGHUP cancel the run, so tshark and editcap are stopped and the chunk files beside
        # the user's capture are removed. Only the first does: a second Ctrl-C must not cut that cleanup short.
        loop, task = asyncio.get_running_loop(), asyncio.current_task()

        def on_signal(sig: int) -> None:
            stopped_by.append(sig)
            if len(stopped_by) == 1:
                task.cancel()

        stoppers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        for sig in stoppers:
            loop.add_signal_handler(sig, on_signal, sig)
        pipeline = Pipeline.with_detectors(redact=args.redact)
        ticker = asyncio.create_task(_progress_line(pipeline, "analyzing"))
        try:
            return await analyze(captures, pipeline, jobs=args.jobs)
        finally:
            ticker.cancel()
            # Removed while the loop runs: asyncio.run closes the loop's wakeup pipe before it removes them, and a
            # signal in between printed "Exception ignored ... Bad file descriptor" with a traceback.
            for sig in stoppers:
                loop.remove_signal_handler(sig)
                if stopped_by:  # already on the way out: a repeated Ctrl-C must not interrupt the exit either
                    signal.signal(sig, signal.SIG_IGN)

    try:
        report = asyncio.run(run())
    except InputError as e:
        return _err(str(e))
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        return 128 + stopped_by[0]
    sys.stdout.write(RENDERERS[args.output](report))
    return report.exit_code()


def _ifaces(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,15}", n)]
    if not names or bad:
        raise ValueError(f"--iface takes interface names like lo,eth0 (got {text!r})")
    return names


def _watch_options(args, kube):
    from .kube.debug import DEFAULT_IMAGE
    from .kube.target import Target
    from .live import WatchOptions

    return WatchOptions(target=Target.parse(args.target) if args.target else None, selector=args.selector,
                        namespace=args.namespace or kube.namespace,
                        duration_s=args.duration, image=args.image or DEFAULT_IMAGE, ttl_s=int(args.ttl),
                        write_pcap_dir=args.write_pcap, admin_port=args.proxy_admin_port,
                        full_capture=args.full_capture,
                        ifaces=_ifaces(args.iface), profile=args.profile, start_timeout_s=args.start_timeout)


def _cmd_watch(args) -> int:
    from .kube.client import KubeError, KubeOptions, connect
    from .kube.target import Target

    if bool(args.target) == bool(args.selector):
        return _err("name one target: pod/NAME, deploy/NAME, or -l SELECTOR")
    try:
        if args.target:
            Target.parse(args.target)
        kube = connect(KubeOptions(args.kubeconfig, args.context, args.namespace, args.request_timeout))
        opts = _watch_options(args, kube)
    except (ValueError, KubeError) as e:
        return _err(str(e))
    if args.dry_run:
        return _watch_dry_run(opts)
    if opts.write_pcap_dir is not None:
        try:  # before anything changes in the cluster, not after the debug container is up
            _writable_dir(opts.write_pcap_dir, "--write-pcap")
        except ValueError as e:
            return _err(str(e))
    if args.no_tui or not (sys.stdout.isatty() and sys.stdin.isatty()):
        # No terminal to draw on (a script, a pipe, cron): a screen there would wait for a q that never comes.
        return _watch_headless(kube, opts, args.output, args.verbose, args.redact)
    from .tui.run import run_tui

    return run_tui(kube, opts, args.output, args.redact)


def _writable_dir(path: Path, flag: str) -> None:
    """Create ``path`` (and its parents) unless it exists; raise ValueError naming ``flag`` when it cannot hold
    files."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot create it: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: not writable")


def _watch_dry_run(opts) -> int:
    import json

    from .kube.debug import container_spec, new_container_name
    from .kube.rbac import WATCH_PERMISSIONS, role_yaml

    spec = container_spec(new_container_name(), opts.image, opts.ttl_s, opts.profile)
    print(f"# watch would add this ephemeral container to {opts.target.kind}/{opts.target.name} in namespace "
          f"{opts.namespace} (PATCH pods/ephemeralcontainers), unless a meshdoctor-* container already runs:")
    print(json.dumps({"spec": {"ephemeralContainers": [spec]}}, indent=2))
    print("# and it needs these permissions (portforward and log are optional: Envoy counters and access log):")
    print(role_yaml(opts.namespace, WATCH_PERMISSIONS))
    return 0


def _watch_headless(kube, opts, output: str, verbose: bool = False, redact: bool = True) -> int:
    from .kube.client import KubeError
    from .live import watch
    from .pipeline import Pipeline

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        def on_signal(sig: int) -> None:
            if stop.is_set():  # asked twice: stop waiting for a clean end (the pod's dead-man's switch remains)
                loop.remove_signal_handler(sig)
                os.kill(os.getpid(), sig)
            stop.set()  # stop cleanly and still print the report

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, on_signal, sig)

        # Progress and live findings go to a terminal only, so scripts see stderr hold just the one error line.
        live = sys.stderr.isatty()

        def progress(msg: str) -> None:
            if live or verbose:
                sys.stderr.write(f"\r\033[K{msg}\n" if live else f"{msg}\n")
                sys.stderr.flush()

        def on_finding(f) -> None:
            if live:
                sys.stderr.write(f"\r\033[K{f.severity.value}: {f.detector}: {f.title} ({f.flow.client} -> "
                                 f"{f.flow.server})\n")

        pipelines = []

        def make_pipeline(pod: str) -> Pipeline:
            pipelines.append(Pipeline.with_detectors(on_finding=on_finding, redact=redact, pod=pod))
            return pipelines[-1]

        ticker = asyncio.create_task(_progress_line(pipelines, "capturing"))
        try:
            report = await watch(kube, opts, make_pipeline, stop, progress)
        except KubeError as e:
            return _err(str(e))
        finally:
            ticker.cancel()
        for p in report.problems:
            sys.stderr.write(f"problem: {p['where']}: {p['what']}\n")
        sys.stdout.write(RENDERERS[output](report))
        return report.exit_code()

    return asyncio.run(main())


def _cmd_log_level(args) -> int:
    import json

    from .envoy.logging import RESET
    from .kube.admin import EnvoyAdmin
    from .kube.client import KubeError, KubeOptions, connect
    from .kube.target import Target, check_capturable, pods_by_selector, resolve_pods
    from .loglevel import render_table, set_log_levels

    if bool(args.target) == bool(args.selector):
        return _err("name one target: pod/NAME, deploy/NAME, or -l SELECTOR")
    spec = RESET if args.reset else args.level
    admins: list[EnvoyAdmin] = []
    try:
        kube = connect(KubeOptions(args.kubeconfig, args.context, args.namespace, args.request_timeout))
        ns = args.namespace or kube.namespace
        pods = (pods_by_selector(kube, args.selector, ns) if args.selector
                else resolve_pods(kube, Target.parse(args.target), ns))
        for pod in pods:
            check_capturable(pod)
        admins = [EnvoyAdmin(kube, pod.metadata.namespace, pod.metadata.name, args.proxy_admin_port)
                  for pod in pods]
        results = set_log_levels(admins, spec)
    except (ValueError, KubeError) as e:  # LevelError is a ValueError; nothing was changed then
        return _err(str(e))
    finally:
        for a in admins:
            a.close()
    if args.output == "json":
        print(json.dumps({"level": spec, "proxies": [{"pod": r.pod, "loggers": r.levels} for r in results]},
                         indent=2))
    else:
        named = tuple(part.replace("=", ":").split(":")[0].strip() for part in (args.level or "").split(",")
                      if ":" in part or "=" in part)
        sys.stdout.write(render_table(results, named))
    return 0


def _cmd_lint(args) -> int:
    from kubernetes.client import ApiClient

    from .kube.client import KubeError, KubeOptions, api_call, connect
    from .kube.target import Target, resolve_pods
    from .lint import lint_pods
    from .pipeline import PipelineStats
    from .report import Report

    if sum(map(bool, (args.target, args.selector, args.all_namespaces))) != 1:
        return _err("name one target: pod/NAME, deploy/NAME, -l SELECTOR, or -A")
    try:
        kube = connect(KubeOptions(args.kubeconfig, args.context, args.namespace, args.request_timeout))
        ns = args.namespace or kube.namespace
        if args.all_namespaces:
            pods = api_call(kube, "listing pods", kube.core.list_pod_for_all_namespaces).items
        elif args.selector:
            pods = api_call(kube, f"listing pods with -l {args.selector}", kube.core.list_namespaced_pod, ns,
                            label_selector=args.selector).items
        else:
            pods = resolve_pods(kube, Target.parse(args.target), ns)
    except (ValueError, KubeError) as e:
        return _err(str(e))
    if not pods:
        return _err("no pod matches")
    serialize = ApiClient().sanitize_for_serialization
    findings = lint_pods([serialize(p) for p in pods])
    names = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods]
    report = Report({"kind": "lint", "pods": names}, PipelineStats(), findings)
    sys.stdout.write(RENDERERS[args.output](report))
    return report.exit_code()


def _cmd_lab(args) -> int:
    from .lab import lab
    from .lab.state import LabError

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", args.name):
        return _err(f'lab name "{args.name}" must be a Kubernetes namespace name (lower case letters, digits, -)')
    state_dir = args.state_dir or lab.default_state_dir(args.name)
    try:
        if args.lab_command == "up":
            pods = [p.strip() for p in args.pods.split(",") if p.strip()]
            sys.stderr.write(f"creating lab {args.name} with pods {', '.join(pods)} ...\n")
            mesh = lab.MeshOptions(access_log_encoding=args.access_log.upper(), legacy_inbound=args.legacy_inbound)
            state = lab.up(args.name, state_dir, pods, mesh=mesh)
            print(f"lab {state.name} is up: pods {', '.join(p.name for p in state.pods)} in namespace "
                  f"{state.namespace}")
            print(f"kubeconfig: {state.kubeconfig}")
            print(f"try:  kubectl meshdoctor watch pod/{state.pods[0].name} --kubeconfig {state.kubeconfig}")
        elif args.lab_command == "down":
            lab.down(state_dir)
            print(f"lab in {state_dir} is down")
        else:
            state = lab.status(state_dir)
            if state is None:
                print(f"no lab in {state_dir}")
                return 0
            print(_describe_lab(state))
            obs = state.observed
            return 0 if obs is None or (not obs.dead and not obs.netns_missing) else 1
    except LabError as e:
        return _err(str(e))
    return 0


def _describe_lab(state) -> str:
    obs = state.observed
    lines = [f"lab {state.name}: namespace {state.namespace}, kubeconfig {state.kubeconfig}",
             f"  sidecars: Envoy, access log {state.mesh.access_log_encoding}, inbound dialled "
             + ("on 127.0.0.1 (Istio < 1.10)" if state.mesh.legacy_inbound else "from 127.0.0.6 (Istio >= 1.10)")]
    for pod in state.pods:
        lines.append(f"  pod/{pod.name}  {pod.pod_ip}  client {pod.client_ip}  netns {pod.netns}  "
                     f"scenario {pod.scenario}")
    if obs is not None:
        lines.append(f"  processes running: {', '.join(obs.running) or 'none'}")
        if obs.dead:
            lines.append(f"  processes dead: {', '.join(obs.dead)} (see the logs in {state.state_dir})")
        if obs.netns_missing:
            lines.append(f"  network namespaces missing: {', '.join(obs.netns_missing)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler = {"watch": _cmd_watch, "analyze": _cmd_analyze, "lab": _cmd_lab,
               "log-level": _cmd_log_level, "lint": _cmd_lint}[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `| head` closed our stdout
        return 0
    except Exception as e:  # a bug of ours: one line, the traceback only on request
        if os.environ.get("MESHDOCTOR_DEBUG"):
            traceback.print_exc()
        first = str(e).splitlines()[0] if str(e) else ""
        return _err(f"internal error: {type(e).__name__}: {first} (set MESHDOCTOR_DEBUG=1 for details)")


if __name__ == "__main__":
    sys.exit(main())
