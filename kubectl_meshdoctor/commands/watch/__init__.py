"""`kubectl meshdoctor watch`: flags to WatchOptions, then the TUI on a terminal (session.py), else a headless
capture (live.py) and its report on stdout; `--dry-run` prints what would change in the cluster."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import sys
from pathlib import Path

from kubectl_meshdoctor.commands.console import end_progress_line, error, progress_line
from kubectl_meshdoctor.commands.watch.headless_stop import found_so_far, leave_now, within_grace
from kubectl_meshdoctor.commands.watch.live import MAX_PODS, WatchOptions, WatchState, watch
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.exit_codes import EXIT_OK
from kubectl_meshdoctor.kube.client import KubeError, KubeOptions, connect
from kubectl_meshdoctor.kube.debug import DEFAULT_IMAGE, container_spec, new_container_name, running_debug_container
from kubectl_meshdoctor.kube.rbac import WATCH_PERMISSIONS, preflight, role_yaml
from kubectl_meshdoctor.kube.target import capturable_pods, describe_targets, parse_targets
from kubectl_meshdoctor.private_dirs import remove_stale_private_dirs
from kubectl_meshdoctor.frontends.report import rendered_for
from kubectl_meshdoctor.frontends.shown import one_line


# Said once on a terminal by a headless watch without --duration, which otherwise never says how it ends.
UNTIL_CTRL_C = "capturing until Ctrl-C: Ctrl-C ends the capture and prints the report"


def _ifaces(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,15}", n)]
    if not names or bad:
        raise ValueError(f"--iface takes interface names like lo,eth0 (got {text!r})")
    return names


def _watch_options(args, kube):
    return WatchOptions(targets=parse_targets(args.target), selector=args.selector,
                        namespace=args.namespace or kube.namespace,
                        duration_s=args.duration, image=args.image or DEFAULT_IMAGE, ttl_s=math.ceil(args.ttl),
                        write_pcap_dir=args.write_pcap, overwrite_pcap=args.overwrite,
                        admin_port=args.proxy_admin_port,
                        full_capture=args.full_capture, dissect=args.dissect, envoy_debug=args.envoy_debug,
                        ifaces=_ifaces(args.iface), profile=args.profile, start_timeout_s=args.start_timeout)


def run(args) -> int:
    """`kubectl meshdoctor watch`: the TUI on a terminal, else a headless capture and its report."""

    if args.target and args.selector:
        return error("name pods and deployments, or -l SELECTOR, not both")
    if not args.target and not args.selector:
        return error("name what to capture: pod/NAME, deploy/NAME (one or more), or -l SELECTOR")
    try:
        parse_targets(args.target)
        kube = connect(KubeOptions(args.kubeconfig, args.context, args.namespace, args.request_timeout))
        opts = _watch_options(args, kube)
    except (ValueError, KubeError) as e:
        return error(str(e))
    if opts.dissect == "pod" and opts.write_pcap_dir is not None:
        return error("--write-pcap needs the packets here; with --dissect pod only tshark's fields leave the pod")
    if opts.overwrite_pcap and opts.write_pcap_dir is None:
        return error("--overwrite replaces --write-pcap's files: give --write-pcap DIR too")
    if args.dry_run:
        return _watch_dry_run(kube, opts)
    remove_stale_private_dirs()  # a killed watch's spool: capture bytes nobody asked to keep
    if opts.write_pcap_dir is not None:
        try:  # before anything changes in the cluster, not after the debug container is up
            _writable_dir(opts.write_pcap_dir, "--write-pcap")
        except ValueError as e:
            return error(str(e))
    if args.no_tui or not (sys.stdout.isatty() and sys.stdin.isatty()):
        # No terminal to draw on (a script, a pipe, cron): a screen there would wait for a q that never comes.
        return _watch_headless(kube, opts, args.output, args.verbose, args.redact)
    try:
        # A typo or a missing permission is one line before the screen opens, not a status line in a screen
        # waiting for q (where a key typed meanwhile could act on an empty run).
        capturable_pods(kube, opts.targets, opts.selector, opts.namespace, MAX_PODS)
        preflight(kube, opts.namespace)  # its warnings (optional permissions) are the run's to say, on screen
    except KubeError as e:
        return error(str(e))
    from kubectl_meshdoctor.commands.watch.live_session import run_tui  # textual is imported only to draw

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


def _watch_dry_run(kube, opts) -> int:
    """What watch would change, after reading (GET only) the pods it would capture: a running meshdoctor-*
    container is reused, so only the pods without one would get the container shown."""
    what = describe_targets(opts.targets, opts.selector)
    try:
        pods = capturable_pods(kube, opts.targets, opts.selector, opts.namespace, MAX_PODS)
        unless, refused = "", ""
    except KubeError as e:  # watch would stop there too; the container and the RBAC it needs are still worth showing
        pods, unless = [], f", unless a meshdoctor-* container already runs (cannot tell: {str(e).splitlines()[0]})"
        refused = str(e).splitlines()[0]
    adding = []
    for pod in pods:
        running = running_debug_container(pod)
        if running:
            print(f"# watch would reuse the running ephemeral container {running} in pod/{pod.metadata.name} "
                  f"(nothing added)")
        else:
            adding.append(f"pod/{pod.metadata.name}")
    if adding or not pods:
        print(f"# watch would add this ephemeral container to {', '.join(adding) or what} in namespace "
              f"{opts.namespace} (PATCH pods/ephemeralcontainers){unless}:")
        spec = container_spec(new_container_name(), opts.image, opts.ttl_s, opts.profile)
        print(json.dumps({"spec": {"ephemeralContainers": [spec]}}, indent=2))
    if opts.envoy_debug:
        loggers = ", ".join(Pipeline.with_detectors().envoy_loggers())
        print(f"# --envoy-debug: it would raise these Envoy loggers of each sidecar to debug for the run (those not at "
              f"debug or trace already): {loggers}; a guard in the debug container (sh, and curl or wget) records the "
              f"levels found and puts them back if watch dies")
    print("# and it needs these permissions (portforward and log are optional: Envoy counters and access log):")
    print(role_yaml(opts.namespace, WATCH_PERMISSIONS))
    # the run itself would stop at the target: a script checking the plan must learn that as well
    return error(refused) if refused else EXIT_OK


def _watch_headless(kube, opts, output: str, verbose: bool = False, redact: bool = True) -> int:
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
                sys.stderr.write(f"\r\033[K{f.severity.value}: {f.detector}: {one_line(f.title)} "
                                 f"({f.flow.text(labelled=False)})\n")

        if live and opts.duration_s is None:  # a run with no end of its own: say once how it ends, and that it reports
            sys.stderr.write(f"{UNTIL_CTRL_C}\n")
        pipelines = []

        def make_pipeline(pod: str) -> Pipeline:
            pipelines.append(Pipeline.with_detectors(on_finding=on_finding, redact=redact, pod=pod))
            return pipelines[-1]

        state = WatchState()
        waits_on = {"starting": "starting", "resolving": "waiting for the API server (resolving the target)",
                    "preflight": "waiting for the API server (checking RBAC)",
                    "debug-container": "waiting for the debug container to start"}
        ticker = asyncio.create_task(progress_line(pipelines, "capturing",
                                                   waiting=lambda: waits_on.get(state.phase)))
        run = asyncio.ensure_future(watch(kube, opts, make_pipeline, stop, progress, state))
        try:
            ended = await within_grace(run, stop, state.steps)
            report = run.result() if ended else found_so_far(pipelines, [p.ctx.pod for p in pipelines],
                                                              opts.namespace)
        except KubeError as e:
            return error(str(e))
        finally:
            ticker.cancel()
            end_progress_line()
        for p in report.problems:
            sys.stderr.write(f"problem: {one_line(p.line())}\n")
        sys.stdout.write(rendered_for(output, report, sys.stdout))
        if not ended:
            leave_now(report.exit_code())  # the threads the API server holds are not waited for
        return report.exit_code()

    return asyncio.run(main())
