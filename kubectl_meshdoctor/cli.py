"""``kubectl meshdoctor``: the command line front end. Parses flags, hands them to the command's module
(``commands/``), or to a command another distribution adds (``commands/extensions.py``: the pod lab), maps
what escapes it to exit codes.

Exit codes (docs/DESIGN.md): 0 no error finding, 1 at least one error finding, 2 usage or input error (one line on
stderr, never a traceback; set MESHDOCTOR_DEBUG=1 to see one for an internal error), or a run that read nothing
and found no error (its report is printed, its problems say why).
"""

from __future__ import annotations

import signal

# A Ctrl-C while Python is still importing should just end the program, not print an import traceback;
# main() installs the usual KeyboardInterrupt handling once it runs.
signal.signal(signal.SIGINT, signal.SIG_DFL)

import argparse  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from kubectl_meshdoctor import __version__
from kubectl_meshdoctor.commands.console import PROG, error
from kubectl_meshdoctor.commands.help_format import WrappingHelpFormatter
from kubectl_meshdoctor.commands.extensions import KNOWN_ELSEWHERE, load_extensions
from kubectl_meshdoctor.core.registry import DetectorLoadError
from kubectl_meshdoctor.exit_codes import EXIT_CODES_HELP, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from kubectl_meshdoctor.frontends.report import RENDERERS
from kubectl_meshdoctor.gc_tuning import tune_gc

# Each command's module under kubectl_meshdoctor/commands/ has run(args) -> exit code.
COMMANDS = {"watch": "watch", "analyze": "analyze", "lint": "lint", "log-level": "log_level"}

EPILOG_MAIN = """\
examples:
  kubectl meshdoctor watch pod/reviews-v1-7d9 -n shop
  kubectl meshdoctor watch deploy/reviews -n shop --no-tui --duration 120 \\
      -o json > report.json
  kubectl meshdoctor analyze lo.pcap eth0.pcapng -o json
  sudo "$(command -v kubectl-meshdoctor)" lab up   # a local pod lab with real failures, and its kubeconfig

""" + EXIT_CODES_HELP

EPILOG_WATCH = """\
watch adds (or reuses) an ephemeral container meshdoctor-* targeting istio-proxy, runs tcpdump on the pod's
lo and eth0, and runs every detector live. Ephemeral containers cannot be removed; the container's command is a
bounded sleep (--ttl), and the tcpdumps end when watch ends.

examples:
  kubectl meshdoctor watch pod/reviews-v1-7d9 -n shop
  kubectl meshdoctor watch deploy/reviews --context prod --no-tui --duration 60
  kubectl meshdoctor watch pod/productpage-v1-5f8 pod/reviews-v1-7d9 -n shop  # both hops: the 503's caller and server
  kubectl meshdoctor watch pod/busy-gateway --dissect pod   # tshark in the debug container, not here
  kubectl meshdoctor watch pod/reviews-v1-7d9 --envoy-debug # Envoy's debug lines as evidence, for the run only
  kubectl meshdoctor watch pod/collision \\
      --kubeconfig /run/kubectl-meshdoctor/meshdoctor-lab/kubeconfig

""" + EXIT_CODES_HELP

EPILOG_ANALYZE = """\
Several pods (a caller and a server saw the same connections on their own eth0): give one DIR a pod,
named after the directory; every file in it is read by its content, and each pod is analysed apart
(what else it holds, a subdirectory, a pipe, a broken link, is named in the report's problems and not read).
A DIR holding only directories (watch --write-pcap DIR over several pods) is one pod each.
FILE:POD/IFACE (or FILE:POD/) puts one file in pod POD (joining DIR POD, if given); FILE:IFACE takes
interface names only (lo, eth0, ...): a pod is FILE:POD/. The lines of a kubectl logs --prefix (or stern)
file go to the pods they name. Two directories of one name are refused. Without a pod anywhere, all files
are one pod.

The interface of a capture comes from :IFACE, else pcapng interface blocks or Linux cooked headers, else its
name (lo.pcap, reviews-eth0.pcap), else its content (loopback link or 127.0.0.0/8, ::1 traffic: lo; else
eth0); lo and eth0 merged into one file (mergecap) are told apart a packet at a time, by their interface's
name, or by content where it has none. Frame numbers in the report are those Wireshark shows for that file.
tshark yields only the packets a detector can act on (SYN, FIN, RST, HTTP/1 message starts, challenge-ACK
candidates); the packet counts are of those.

examples:
  kubectl meshdoctor analyze lo.pcap eth0.pcap
  kubectl meshdoctor analyze capture.pcapng:eth0 -o json
  kubectl meshdoctor analyze caller/ server/           # one directory a pod: each pod's findings apart
  kubectl meshdoctor analyze caller/ dump.pcap:server/eth0 proxy.log:server/
  kubectl meshdoctor analyze lo.pcap eth0.pcap --tui    # browse findings, ladder diagrams and packets
  kubectl logs -l app=reviews -c istio-proxy --prefix --timestamps > proxy.log
  kubectl meshdoctor analyze proxy.log lo.pcap          # access logs as kubectl, stern, grep or a node wrote them
  kubectl meshdoctor analyze proxy.log --log-format \\
      '[%START_TIME%] "%REQ(:PATH)%" %RESPONSE_CODE% %RESPONSE_FLAGS%'
  kubectl meshdoctor analyze proxy.json \\
      --log-format '{"at": "%START_TIME%", "code": "%RESPONSE_CODE%"}'
  kubectl meshdoctor log-level pod/reviews-v1-7d9 \\
      --level connection:debug,pool:debug,router:debug,http:debug
  kubectl logs reviews-v1-7d9 -c istio-proxy > envoy-debug.log # then put the levels back: log-level ... -r
  kubectl meshdoctor analyze envoy-debug.log            # Envoy's own account: a pooled connection reused, closed
  kubectl meshdoctor analyze ticket.txt                 # the lines someone pasted into the incident ticket
  kubectl meshdoctor analyze stats-before.txt stats-after.txt   # /stats alone: what moved between them
"""


EPILOG_LOGLEVEL = """\
examples:
  kubectl meshdoctor log-level pod/reviews-v1-7d9                       # show the levels
  kubectl meshdoctor log-level pod/reviews-v1-7d9 --level http:debug
  kubectl meshdoctor log-level deploy/reviews --level debug
  kubectl meshdoctor log-level -l app=reviews -r                         # back to Istio's defaults

A bad level or an unknown logger exits 2 before any proxy is changed and names the valid ones.
Levels a killed `watch --envoy-debug` left raised (and whose guard in the debug container is gone too) are put
back first, and said on stderr.
"""


EPILOG_LINT = """\
examples:
  kubectl meshdoctor lint pod/reviews-v1-7d9 -n shop
  kubectl meshdoctor lint deploy/reviews -o markdown
  kubectl meshdoctor lint -l app=reviews -o json
  kubectl meshdoctor lint -A                     # every pod you can list
  kubectl meshdoctor lint -f pod.yaml            # a saved Pod (kubectl get pod X -o yaml), no cluster needed
  # check a printed fix of the pod's own spec (a probe, a port) before you apply it: merge it into the pod as
  # kubectl does and lint the result; a fix by annotation acts when the injector recreates the pod: lint that pod
  kubectl get pod X -o json \\
    | kubectl patch --local -f - --type strategic -p "$(cat fix.yaml)" -o json \\
    | kubectl meshdoctor lint -f -

rules: redirect-exposure, probe-port, restart-loop, no-sidecar, sidecar-not-ready, hold-application,
probe-not-rewritten, excluded-port-exposed; exit 1 when any finding is an error.
"""


class _Parser(argparse.ArgumentParser):
    # An epilog built only when --help is asked for (from the detectors: not worth importing on every run).
    epilog_of: Callable[[], str] | None = None
    # Options' help built the same way, by dest: what they list comes from the code, not a copy of it.
    help_of: dict[str, Callable[[], str]] | None = None
    commands: tuple[str, ...] = ()  # the root parser's: every command it takes, its own and extensions'

    def __init__(self, *args, **kwargs) -> None:
        # Every parser of the CLI, the lab's actions too (they come through extensions): prose re-wrapped to
        # the terminal, examples as written (commands/help_format.py).
        kwargs["formatter_class"] = WrappingHelpFormatter
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line and exit 2, like kubectl
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see --help)\n")

    def format_help(self) -> str:
        if self.epilog_of is not None:
            self.epilog = self.epilog_of()
        for action in self._actions if self.help_of else ():
            if action.dest in self.help_of:
                action.help = self.help_of[action.dest]()
        return super().format_help()


def _kube_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (as kubectl)")
    g.add_argument("-n", "--namespace", help="namespace of the target (default: the context's, else default)")
    g.add_argument("--context", help="kubeconfig context to use (default: current-context)")
    g.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    g.add_argument("--request-timeout", type=_request_timeout, default=30.0, metavar="DURATION",
                   help="timeout of each API request, as kubectl: seconds or 30s, 1m, 500ms; 0 for none "
                        "(default 30s)")


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=sorted(RENDERERS), default="text",
                   help="report format (default text); json is the stable schema, markdown for tickets")
    p.add_argument("--no-redact", dest="redact", action="store_false",
                   help="show the values hidden by default because reports get shared: of authorization, cookie, "
                        "set-cookie, proxy-authorization and x-api-key headers, of headers whose names are not "
                        "tokens, and of token, code and key parameters in request targets")


def _request_timeout(text: str) -> float | None:
    from kubectl_meshdoctor.kube.duration import parse_request_timeout

    try:
        return parse_request_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"invalid --request-timeout {text!r}: ")
                                         + f": {text!r}") from None


def _positive(text: str) -> float:
    # Seconds, or a duration as kubectl users type one (2m, 1m30s): --request-timeout takes both.
    from kubectl_meshdoctor.kube.duration import parse_seconds

    try:
        return parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _envoy_debug_help() -> str:
    # The loggers watch raises (Pipeline.envoy_loggers: the detectors' and envoy/story.py STORY_LOGGERS), asked of
    # the code when --help is: a list copied here missed `filter`.
    from kubectl_meshdoctor.core.pipeline import Pipeline

    loggers = ", ".join(sorted(Pipeline.with_detectors().envoy_loggers()))
    return ("for this run only, raise the sidecar's Envoy loggers the detectors read (" + loggers + ") to debug, so "
            "each failing request is also told in Envoy's own words (findings quote those lines); the levels found "
            "are put back when watch ends (q, Ctrl-C, SIGTERM, --duration), by a guard in the debug container if "
            "watch is killed, else by the next watch or log-level on the pod. In the TUI: l, then v toggles it")


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
                epilog=EPILOG_MAIN)
    p.add_argument("--version", action="version", version=f"kubectl-meshdoctor {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    w = sub.add_parser("watch", help="capture a pod live and show findings (TUI, or a report with --no-tui)",
                       description="Capture a pod's lo and eth0 live and run every detector.",
                       epilog=EPILOG_WATCH)
    w.add_argument("target", nargs="*", metavar="pod/NAME|deploy/NAME",
                   help="what to capture (a bare NAME is a pod); deploy/NAME captures every pod of it; name "
                   "several (pod/caller pod/server, or pods caller server) to see both hops of a request")
    w.add_argument("-l", "--selector", help="capture every running pod with these labels (at most 100)")
    _kube_flags(w)
    w.add_argument("--no-tui", action="store_true", help="no screen: print a report at the end (the default "
                   "when stdout or stdin is not a terminal)")
    w.add_argument("--duration", type=_positive, metavar="DURATION",
                   help="stop after this long: seconds or 90s, 2m, 1h (default: until q / Ctrl-C)")
    _output_flag(w)
    w.add_argument("--image", default=None, help="debug container image with tcpdump "
                   "(default docker.io/nicolaka/netshoot:v0.13)")
    w.add_argument("--ttl", type=_positive, default=3600, metavar="DURATION",
                   help="the debug container's sleep: it ends by itself after this; seconds or 30m, 2h (default 1h)")
    w.add_argument("--iface", default="lo,eth0", metavar="LIST",
                   help="the pod's interfaces to capture, comma-separated (default lo,eth0)")
    w.add_argument("--proxy-admin-port", type=int, default=15000, metavar="PORT",
                   help="the sidecar's Envoy admin port, for counters (default 15000)")
    w.add_argument("-v", "--verbose", action="store_true",
                   help="progress lines on stderr even when it is not a terminal (e.g. \"capturing ...\")")
    w.add_argument("--start-timeout", type=_positive, default=120, metavar="DURATION",
                   help="how long the debug container may take to start, e.g. pulling its image; seconds or 90s, 5m "
                   "(default 2m)")
    w.add_argument("--profile", choices=("least", "netadmin"), default="least",
                   help="debug container capabilities: least = NET_RAW only (default), netadmin = NET_ADMIN too")
    w.add_argument("--dry-run", action="store_true",
                   help="print the ephemeral container watch would add and the RBAC it needs; change nothing")
    w.add_argument("--write-pcap", type=Path, metavar="DIR",
                   help="also save the lo and eth0 captures in DIR as POD-IFACE.pcap, as captured, owner-only "
                   "(add --full-capture for every TCP packet; they carry secrets: only on request); with several "
                   "pods in DIR/POD/, one folder a pod (analyze DIR reads them back as those pods). A file of "
                   "that name is refused unless --overwrite; a symbolic link always")
    w.add_argument("--overwrite", action="store_true",
                   help="with --write-pcap: replace capture files of the same name in DIR")
    w.add_argument("--dissect", choices=("local", "pod"), default="local",
                   help="where tshark runs: local = here, one for every pod (default); pod = in each debug "
                   "container, beside its tcpdump (needs tshark in --image, as netshoot has; ~160 MB of the pod's "
                   "memory an interface), so only the fields of the packets detectors read cross the API: less "
                   "CPU here on a busy pod, but no pcap bytes (no --write-pcap, no saving a finding's packets)")
    w.add_argument("--envoy-debug", action="store_true", help="raise the loggers the detectors read to debug")
    w.help_of = {"envoy_debug": _envoy_debug_help}
    w.add_argument("--full-capture", action="store_true",
                   help="capture every TCP packet; by default tcpdump in the pod keeps what a detector reads "
                   "(SYN/FIN/RST, HTTP/1 message starts on lo, pure ACKs on eth0), which keeps up with busier pods")

    ll = sub.add_parser("log-level", help="show or change the sidecars' Envoy log levels (like istioctl "
                        "proxy-config log)", description="Show or change Envoy log levels of the sidecar of "
                        "a pod, of every pod of a deployment, or of every pod matching -l. Compatible with "
                        "istioctl proxy-config log.", epilog=EPILOG_LOGLEVEL,)
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
                        epilog=EPILOG_LINT)
    li.add_argument("target", nargs="?", metavar="pod/NAME|deploy/NAME", help="what to check (or use -l / -A / -f)")
    li.add_argument("-f", "--filename", metavar="FILE",
                    help="Pods from a file instead of the cluster: YAML or JSON, one or more documents, a List "
                         "(kubectl get pods -o yaml); - for stdin")
    li.add_argument("-l", "--selector", help="every pod with these labels")
    li.add_argument("-A", "--all-namespaces", action="store_true", help="every pod of every namespace")
    _kube_flags(li)
    _output_flag(li)

    a = sub.add_parser("analyze", help="run the detectors on captures, Envoy's logs and admin dumps",
                       description="Run the detectors offline on what you already hold, in any mix: capture files "
                                   "(tcpdump, ksniff, Wireshark; pcap or pcapng, also gzipped), the sidecar's log "
                                   "(kubectl logs -c istio-proxy: its access log in any format Istio has shipped, "
                                   "and Envoy's own debug log in any of its shapes), lines pasted from a ticket "
                                   "(kubectl --prefix/--timestamps, stern, CRI and Docker log files, grep, e-mail "
                                   "quoting, Markdown), and Envoy admin dumps (/stats or /stats/prometheus, one or "
                                   "two; /clusters). A file it cannot read is named in the report's problems and "
                                   "the others are read; exit 2 only when nothing could be read.",
                       epilog=EPILOG_ANALYZE)
    a.add_argument("files", nargs="+", metavar="FILE|DIR",
                   help="FILE[:IFACE]: a capture (:IFACE names its interface: lo, eth0, ...), an access log or an "
                        "admin dump, the kind read from the contents; FILE:POD/IFACE or FILE:POD/: one file of "
                        "pod POD; DIR: one pod's files, the pod named after the directory (or a folder of "
                        "such directories)")
    a.add_argument("--tui", action="store_true", help="open the findings in the TUI (ladder diagrams, packets "
                   "pane, s saves a finding's packets); the report is printed when you quit")
    a.add_argument("--log-format", metavar="FORMAT",
                   help="the sidecars' access-log format, when the mesh sets its own (meshConfig.accessLogFormat; "
                        "every default Istio and Envoy have shipped is read without it): a TEXT format string of "
                        "Envoy command operators, or for the JSON encoding an object of keys to operators; it must "
                        "hold %%RESPONSE_CODE%% or %%RESPONSE_FLAGS%% (examples below)")
    a.add_argument("-j", "--jobs", type=_count, default=None, metavar="N",
                   help="tshark processes at once (default 1: each holds ~160 MB; 2 reads two files ~10%% faster "
                   "on two cores)")
    _output_flag(a)

    extensions = load_extensions(frozenset(COMMANDS))
    p.commands = (*COMMANDS, *extensions)
    for name, ext in extensions.items():
        e = sub.add_parser(name, help=ext.help)
        ext.add_arguments(e)
        e.set_defaults(extension=ext)
    return p


def _leaving(code: int) -> int:
    """``code``, once the run is over. A run stopped while it waited on the API server leaves that call's thread
    behind (commands/watch/stopping.py): a daemon, but one that may write a warning while the interpreter shuts
    down, which aborts it (SIGABRT, not our exit code). Then the exit handlers run now and the process ends at
    once."""
    if any(t.daemon and t.is_alive() and t.name.startswith("api-") for t in threading.enumerate()):
        from kubectl_meshdoctor.commands.watch.headless_stop import leave_now

        leave_now(code)
    return code


# A command's positionals that take several words, which may come after flags, as kubectl takes them
# (`watch pod/a -n shop pod/b`): argparse stops a nargs="*" positional at the first flag.
_SPREAD_POSITIONALS = {"watch": "target", "analyze": "files"}


def _parse(parser: argparse.ArgumentParser, given: list[str]) -> argparse.Namespace:
    """``parser.parse_args(given)``, but the words left over after flags go to the command's spread
    positional; anything else left over is the usual usage error (exit 2)."""
    args, extra = parser.parse_known_args(given)
    dest = _SPREAD_POSITIONALS.get(args.command or "")
    if extra and dest and not any(word.startswith("-") for word in extra):
        setattr(args, dest, [*(getattr(args, dest) or []), *extra])
        return args
    return parser.parse_args(given) if extra else args


# kubectl takes these before its command; ours are the commands' own flags (argparse then read the flag's value
# as the command: "invalid choice: 'ns'").
_KUBE_FLAGS = {"-n": "-n/--namespace", "--namespace": "-n/--namespace", "--context": "--context",
               "--kubeconfig": "--kubeconfig", "--request-timeout": "--request-timeout"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _takes(parser: argparse.ArgumentParser, flags: list[str]) -> bool:
    """Whether ``parser``, or one of its own commands (lab up, lab down), has one of ``flags``."""
    return (any(f in parser._option_string_actions for f in flags)
            or any(_takes(p, flags) for p in _subcommands(parser).values()))


def _kube_flag_first(given: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The one line for ``kubectl meshdoctor -n ns watch pod/x`` (a cluster flag before the command): where the
    flag goes, and the command line with it moved there; or that the command has no such flag (analyze). None
    when ``given`` does not start with one."""
    moved: list[str] = []
    i = 0
    while i < len(given):
        word = given[i]
        name = word.split("=", 1)[0]
        joined = "=" in word or (name.startswith("-n") and not name.startswith("--") and len(name) > 2)
        if (name[:2] if joined and not name.startswith("--") else name) not in _KUBE_FLAGS:
            break
        step = 1 if joined else 2
        moved += given[i:i + step]
        i += step
    if not moved:
        return None
    first = given[0].split("=", 1)[0]
    label = _KUBE_FLAGS[first if first.startswith("--") else first[:2]]
    commands = _subcommands(parser)
    command, rest = (given[i], given[i + 1:]) if i < len(given) and given[i] in commands else ("COMMAND", given[i:])
    if command != "COMMAND" and not _takes(commands[command], label.split("/")):
        return f"{label}: {command} has no such option (see {PROG} {command} --help)"
    return f"{label} goes after the command: {PROG} {shlex.join([command, *moved, *rest])}"


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] in KNOWN_ELSEWHERE and given[0] not in parser.commands:
        return error(f"{given[0]}: {KNOWN_ELSEWHERE[given[0]]}")
    misplaced = _kube_flag_first(given, parser)
    if misplaced is not None:
        return error(misplaced)
    args = _parse(parser, given)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        # Imported on use: --help and a usage error need neither the Kubernetes client, tshark's reader nor
        # the screen.
        extension = getattr(args, "extension", None)
        command = extension or importlib.import_module(f"kubectl_meshdoctor.commands.{COMMANDS[args.command]}")
        tune_gc()
        return _leaving(command.run(args))
    except DetectorLoadError as e:  # an installed detector plugin is broken: its name, not our traceback
        return error(str(e))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `| head` closed our stdout
        return EXIT_OK
    except Exception as e:  # a bug of ours: one line, the traceback only on request
        if os.environ.get("MESHDOCTOR_DEBUG"):
            traceback.print_exc()
        first = str(e).splitlines()[0] if str(e) else ""
        return error(f"internal error: {type(e).__name__}: {first} (set MESHDOCTOR_DEBUG=1 for details)")


if __name__ == "__main__":
    sys.exit(main())
