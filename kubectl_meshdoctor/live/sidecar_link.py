"""The sidecar link, the sidecar's side of a ``watch``: Envoy admin counters before and after, and the followed
log (its access-log lines and Envoy's own component log, sources/proxy_log.py).

Everything here is best effort: a proxy whose admin port cannot be reached (RBAC on pods/portforward, a
non-default port) or whose log cannot be followed still gets its packets analysed; the reason goes into the
report's problems instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubectl_meshdoctor.core.events import AccessLogEvent, EnvoyCountersEvent, EnvoyLogEvent
from kubectl_meshdoctor.core.findings import Problem
from kubectl_meshdoctor.core.report_model import LogLinesRead
from kubectl_meshdoctor.envoy.server_info import envoy_version, file_flush_interval_s
from kubectl_meshdoctor.envoy.stats import by_cluster, delta, parse_stats
from kubectl_meshdoctor.kube.admin import ADMIN_PORT, EnvoyAdmin
from kubectl_meshdoctor.kube.client import Kube, KubeError
from kubectl_meshdoctor.kube.logs import LogFollower

from kubectl_meshdoctor.sources.proxy_log import LogCounts, ProxyLogStream, log_source

SIDECAR_CONTAINER = "istio-proxy"


@dataclass(slots=True)
class ProxyLink:
    """Admin and log access to one pod's sidecar for the length of a run."""

    admin: EnvoyAdmin
    follower: LogFollower | None = None
    log: ProxyLogStream | None = None
    version: str | None = None
    flush_s: float | None = None  # Envoy's file flush interval (its /server_info), None when not read
    stats_before: dict = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def _problem(self, what: str) -> None:
        self.problems.append(Problem(f"pod/{self.admin.pod} {SIDECAR_CONTAINER}", what))


def _snapshot(admin: EnvoyAdmin) -> dict:
    resp = admin.get("/stats")
    if resp.status != 200:
        raise KubeError(f"GET /stats answered {resp.status}")
    return parse_stats(resp.body)


async def open_proxy(kube: Kube, namespace: str, pod: str,
                     on_event: Callable[[AccessLogEvent | EnvoyLogEvent], None],
                     admin_port: int = ADMIN_PORT) -> ProxyLink:
    """Read the proxy's version and counters, and start following its log: each access-log line becomes an
    AccessLogEvent and each fact of Envoy's own log an EnvoyLogEvent, handed to ``on_event`` on the caller's event
    loop in log order (the log is followed and parsed in a thread; ProxyLink.log.idle wants calling now and then
    from the loop, see sources/proxy_log.py)."""
    link = ProxyLink(EnvoyAdmin(kube, namespace, pod, admin_port))
    try:
        info = await asyncio.to_thread(link.admin.get, "/server_info")
        # The body, not json.loads of it: envoy_version turns every bad body (nesting 100000 deep, a number of
        # 5000 digits) into its FormatError, which json.loads would raise as RecursionError or worse.
        link.version = envoy_version(info.body) if info.status == 200 else None
        link.flush_s = file_flush_interval_s(info.body) if info.status == 200 else None
        link.stats_before = await asyncio.to_thread(_snapshot, link.admin)
    except (KubeError, ValueError) as e:
        link._problem(f"Envoy admin not reachable, no counters: {str(e).splitlines()[0]}")
    link.log = ProxyLogStream(log_source(pod, SIDECAR_CONTAINER), asyncio.get_running_loop(), on_event)
    link.follower = LogFollower(kube, namespace, pod, SIDECAR_CONTAINER, link.log.line, link.log.burst,
                                link.log.ended)
    link.follower.start()
    return link


# Istio's default for Envoy's --file-flush-interval-msec (ProxyConfig fileFlushInterval: 1 s), used when the
# sidecar's /server_info did not say; and what the log's way to us adds (the kubelet reading the container's log
# file and the API server passing it on).
ISTIO_FLUSH_S = 1.0
LOG_TRANSPORT_S = 0.3


async def close_proxy(link: ProxyLink, capture_ended: float | None = None) -> EnvoyCountersEvent:
    """Stop following the log; return the counters that moved since ``open_proxy``: per cluster (cluster ->
    stat -> delta) and every stat by its full name (the HCM's and the listeners' too, which detectors read),
    empty when the admin API was not reachable. With ``capture_ended`` (time.time() when the capture stopped),
    the log is followed until Envoy has written out what it held then (its flush interval, and the way to us):
    a request that failed in the capture's last second was otherwise logged after the follow had stopped, and
    its finding went without its access-log line."""
    if link.follower is not None and capture_ended is not None:
        catch_up = capture_ended + (link.flush_s if link.flush_s is not None else ISTIO_FLUSH_S) + LOG_TRANSPORT_S
        await asyncio.sleep(max(0.0, min(catch_up - time.time(), ISTIO_FLUSH_S * 10)))
    if link.follower is not None:
        await asyncio.to_thread(link.follower.stop)
        if link.follower.error:
            link._problem(link.follower.error)
        if link.follower.dropped:
            link._problem(f"{link.follower.dropped} {SIDECAR_CONTAINER} log line(s) could not be read and were "
                          f"dropped; first: {link.follower.drop_reason}")
    counters = EnvoyCountersEvent(time.time(), {}, {}, "the run", None, _stats_source(link.admin))
    if link.stats_before:
        try:
            counters = await asyncio.to_thread(stats_moved, link.admin, link.stats_before)
        except (KubeError, ValueError) as e:
            link._problem(f"Envoy admin not reachable at the end, no counter deltas: {str(e).splitlines()[0]}")
    await asyncio.to_thread(link.admin.close)
    if link.log is not None:
        link.log.close()
    return counters


def _stats_source(admin: EnvoyAdmin) -> str:
    return f"pod/{admin.pod} {SIDECAR_CONTAINER} /stats"


def stats_moved(admin: EnvoyAdmin, before: dict) -> EnvoyCountersEvent:
    """The sidecar's stats that moved since ``before`` (ProxyLink.stats_before: the run's first read), read now:
    per cluster and by full name, since "the run" (a gauge that fell is kept, negative). Blocks. Raises KubeError
    when the admin API cannot be reached, or when ``before`` is empty (it was not reachable at the start);
    envoy.clusters.FormatError (a ValueError) for a body that is not /stats."""
    if not before:
        raise KubeError("no /stats read at the start of the run (Envoy admin was not reachable then)")
    flat = delta(before, _snapshot(admin))
    moved = {cluster: dict(stats) for cluster, stats in by_cluster(flat).items()}
    return EnvoyCountersEvent(time.time(), moved, flat, "the run", None, _stats_source(admin))


def log_summary(link: ProxyLink) -> LogLinesRead:
    """What the followed log held, for the report's Envoy side: access-log lines read, every line, entries of
    Envoy's own log, those a detector reads (facts) and lines of no known kind; zeros when the log was not
    followed."""
    c = link.log.counts if link.log is not None else LogCounts()
    return LogLinesRead(access_log_lines=c.access_log, log_lines=c.lines, component_log_entries=c.component,
                        envoy_log_facts=c.facts, other_log_lines=c.other)
