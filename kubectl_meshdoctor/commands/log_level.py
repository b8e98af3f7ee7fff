"""``log-level``: change the sidecars' Envoy log levels like ``istioctl proxy-config log``, and show the result.

Every change is validated against the logger names the proxy itself reports before any proxy is touched, and
a level counts as applied only once the proxy lists it back (POST /logging with no parameters).
Source: Envoy source/server/admin/logs_handler.cc; istio/istio istioctl/pkg/proxyconfig/proxyconfig.go.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kubectl_meshdoctor.commands.console import error
from kubectl_meshdoctor.commands.envoy_debug import restore_left_behind
from kubectl_meshdoctor.envoy.logging import RESET, log_level_queries, logging_error, parse_logging
from kubectl_meshdoctor.exit_codes import EXIT_OK
from kubectl_meshdoctor.kube.admin import EnvoyAdmin
from kubectl_meshdoctor.kube.client import KubeError, KubeOptions, connect
from kubectl_meshdoctor.kube.debug import running_debug_container
from kubectl_meshdoctor.kube.target import Target, check_capturable, pods_by_selector, resolve_pods

MAX_PARALLEL = 8


@dataclass(frozen=True, slots=True)
class ProxyLevels:
    """What one proxy reports after the change: logger -> level, in Envoy's order."""

    pod: str
    levels: dict[str, str]

    def summary(self) -> str:
        """``warning (57 loggers); connection: debug, misc: error``: the common level, then the exceptions."""
        if not self.levels:
            return "no loggers"
        common, n = Counter(self.levels.values()).most_common(1)[0]
        others = [f"{name}: {lvl}" for name, lvl in self.levels.items() if lvl != common]
        return f"{common} ({n} loggers)" + ("; " + ", ".join(others) if others else "")


def current_levels(admin: EnvoyAdmin) -> dict[str, str]:
    """The proxy's loggers and levels (POST /logging without parameters lists them; GET is refused)."""
    resp = admin.post("/logging")
    if resp.status != 200:
        raise KubeError(f"pod/{admin.pod}: POST /logging answered {resp.status}: {resp.body.strip()[:200]}")
    return parse_logging(resp.body)


def apply_levels(admin: EnvoyAdmin, queries: tuple[str, ...]) -> ProxyLevels:
    """POST each query to /logging in order, then read the levels back. Raises KubeError when Envoy refuses."""
    for query in queries:
        resp = admin.post("/logging", query)
        if resp.status != 200:
            reason = logging_error(resp.body) or resp.body.strip()[:200]
            raise KubeError(f"pod/{admin.pod}: Envoy refused logging?{query}: {reason}")
    return ProxyLevels(admin.pod, current_levels(admin))


def set_log_levels(admins: list[EnvoyAdmin], spec: str | None,
                   progress: Callable[[str], None] = lambda s: None) -> list[ProxyLevels]:
    """Apply ``spec`` (``istioctl proxy-config log --level`` syntax, or ``reset``; None only reads) to every
    proxy. The spec is checked against the first proxy's loggers before any change (LevelError, a ValueError,
    names the valid choices). Raises KubeError for a proxy that cannot be reached or refuses."""
    if not admins:
        return []
    first = current_levels(admins[0])
    queries = log_level_queries(spec, first.keys()) if spec is not None else ()
    progress(f"setting {spec} on {len(admins)} prox{'y' if len(admins) == 1 else 'ies'}" if spec else
             f"reading log levels of {len(admins)} prox{'y' if len(admins) == 1 else 'ies'}")
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(admins))) as pool:
        return list(pool.map(lambda a: apply_levels(a, queries), admins))


def render_table(results: list[ProxyLevels], changed: tuple[str, ...] = ()) -> str:
    """``POD  LEVELS`` lines; ``changed`` loggers are listed explicitly even when they equal the common level."""
    width = max([len("POD")] + [len(r.pod) for r in results])
    lines = [f"{'POD'.ljust(width)}  LEVELS"]
    for r in results:
        text = r.summary()
        shown = [f"{name}: {r.levels[name]}" for name in changed if name in r.levels and f"{name}:" not in text]
        lines.append(f"{r.pod.ljust(width)}  {text}" + ("; " + ", ".join(shown) if shown else ""))
    return "\n".join(lines) + "\n"


class LoggerControl:
    """Read and change one proxy's log levels, for a front end: every call blocks (run it in a worker) and
    returns what the proxy reports afterwards, so a screen shows only confirmed levels.

    Raises KubeError when the proxy cannot be reached or refuses, LevelError for an invalid spec.
    """

    def __init__(self, admin: EnvoyAdmin) -> None:
        self.admin = admin
        self._known: list[str] = []

    @property
    def pod(self) -> str:
        return self.admin.pod

    def levels(self) -> dict[str, str]:
        levels = current_levels(self.admin)
        self._known = list(levels)
        return levels

    def apply(self, spec: str) -> dict[str, str]:
        """``spec`` as ``log-level --level`` takes it (``connection:debug``, ``debug``) or ``reset``."""
        if not self._known:
            self.levels()
        return apply_levels(self.admin, log_level_queries(spec, self._known)).levels


def _left_behind(kube, pod, admin: EnvoyAdmin) -> None:
    """A raise a killed `watch --envoy-debug` left on ``pod`` whose guard is gone too: put back first, and said on
    stderr (commands/envoy_debug.py). Only a pod with a running meshdoctor-* debug container can hold one."""
    container = running_debug_container(pod)
    if container is None:
        return
    try:
        _, _, said = restore_left_behind(kube, pod, container, admin)
    except KubeError as e:
        said = f"pod/{pod.metadata.name}: could not look for log levels a watch left raised: {str(e).splitlines()[0]}"
    if said:
        sys.stderr.write(said + "\n")


def run(args) -> int:
    """`kubectl meshdoctor log-level`: show or set the sidecars' Envoy logger levels."""
    if bool(args.target) == bool(args.selector):
        return error("name one target: pod/NAME, deploy/NAME, or -l SELECTOR")
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
        for pod, admin in zip(pods, admins):
            _left_behind(kube, pod, admin)
        results = set_log_levels(admins, spec)
    except (ValueError, KubeError) as e:  # LevelError is a ValueError; nothing was changed then
        return error(str(e))
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
    return EXIT_OK
