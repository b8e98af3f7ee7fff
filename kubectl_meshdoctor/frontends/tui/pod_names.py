"""Pods named short enough for a row at 80 columns: a watch of several pods names each finding's, access-log line's and
cluster pane's pod, and a deployment's pods differ only in their end (``reviews-v1-7d9f4-abcde``)."""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import DataTable

from kubectl_meshdoctor.core.findings import Finding, Severity
from kubectl_meshdoctor.core.pipeline import PipelineStats

from ..shown import one_line

MAX_LABEL = 20  # columns a pod's short name takes at most
_CUT = "-._"  # where Kubernetes names break into parts (DNS labels and subdomains)


def short_names(pods: Iterable[str], width: int = MAX_LABEL) -> dict[str, str]:
    """Each pod -> the part of its name that tells it from the others: their common leading parts (up to a ``-``,
    ``.`` or ``_``) left out, cut to ``width`` columns (at least 2; keeping its end, else its start, whichever keeps
    the names apart), control bytes escaped (frontends/shown.py). One pod keeps its name, cut alike. ``refused`` and
    ``refused-caller`` share no whole part: both are named in full."""
    names = list(dict.fromkeys(pods))
    prefix = _common_parts(names) if len(names) > 1 else ""
    rest = {p: one_line(p[len(prefix):]) for p in names}
    width = max(width, 2)
    for cut in (_keep_end, _keep_start):
        labels = {p: cut(r, width) for p, r in rest.items()}
        if len(set(labels.values())) == len(labels):
            return labels
    return rest  # too alike to cut apart: whole


def _common_parts(names: list[str]) -> str:
    first, last = min(names), max(names)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    prefix = first[:n]
    while prefix and prefix[-1] not in _CUT:
        prefix = prefix[:-1]
    return prefix if all(len(p) > len(prefix) for p in names) else ""


def _keep_end(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def _keep_start(name: str, width: int) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def other_pods(f: Finding) -> list[str]:
    """The other pods whose sidecars' lines a joined finding quotes (core/hops.py details["hops"]), in order."""
    hops = f.details.get("hops")
    if not isinstance(hops, list):
        return []
    return list(dict.fromkeys(str(h["pod"]) for h in hops if isinstance(h, dict) and h.get("pod")
                              and h.get("pod") != f.pod))


def pod_rows(stats: PipelineStats, findings: list[Finding]) -> dict[str, list]:
    """pod -> [lo packets, eth0 packets, errors, warnings] when several pods are captured (``pod/iface``)."""
    rows: dict[str, list] = {}
    for key, st in stats.by_iface.items():
        pod, sep, iface = key.rpartition("/")
        if not sep:
            return {}
        row = rows.setdefault(pod, [0, 0, 0, 0])
        row[0 if iface == "lo" else 1] += st.packets
    for f in findings:
        if f.pod in rows:
            rows[f.pod][2 if f.severity is Severity.ERROR else 3] += f.severity is not Severity.INFO
    return rows


def fill_pods(table: DataTable, rows: dict[str, list]) -> None:
    """Show ``rows`` (``pod_rows``) in the pods table, updating a pod's row in place; shown only with rows."""
    table.set_class(bool(rows), "many")
    for pod, values in sorted(rows.items()):
        if pod in table.rows:
            for column, value in zip(("lo pkts", "eth0 pkts", "errors", "warnings"), values):
                table.update_cell(pod, column, value)
        else:
            table.add_row(pod, *values, key=pod)
