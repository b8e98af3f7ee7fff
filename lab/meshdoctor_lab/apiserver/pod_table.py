"""Server-side printing of pods: the Table kubectl asks for (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`),
with the columns and AGE wording of kubectl's own pod printer (k8s.io/kubernetes/pkg/printers/internalversion).
"""

from __future__ import annotations

import calendar
import time
from typing import Any


def human_age(seconds: float) -> str:
    """kubectl's short duration: 42s, 5m3s, 2m, 3h, 4d (coarser as it grows)."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 48:
        return f"{h}h"
    return f"{h // 24}d"


_POD_COLUMNS = [
    ("Name", "string", "name", 0), ("Ready", "string", "", 0), ("Status", "string", "", 0),
    ("Restarts", "string", "", 0), ("Age", "string", "", 0), ("IP", "string", "", 1), ("Node", "string", "", 1),
    ("Nominated Node", "string", "", 1), ("Readiness Gates", "string", "", 1),
]


def pod_table(pods: list[dict[str, Any]], resource_version: int, now: float, columns: bool = True) -> dict[str, Any]:
    """The server-side printing kubectl asks for (`Accept: ...;as=Table;g=meta.k8s.io;v=v1`); `columns=False`
    leaves out the column definitions (watch events after the first)."""
    rows = []
    for obj in pods:
        statuses = obj["status"].get("containerStatuses", [])
        ready = sum(1 for s in statuses if s.get("ready"))
        created = calendar.timegm(time.strptime(obj["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        rows.append({
            "cells": [obj["metadata"]["name"], f"{ready}/{len(obj['spec']['containers'])}", obj["status"]["phase"],
                      str(sum(s.get("restartCount", 0) for s in statuses)), human_age(now - created),
                      obj["status"].get("podIP", "<none>"), obj["spec"].get("nodeName", "<none>"), "<none>",
                      "<none>"],
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": obj["metadata"]},
        })
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(resource_version)},
        "columnDefinitions": [{"name": n, "type": t, "format": f, "description": "", "priority": p}
                              for n, t, f, p in _POD_COLUMNS] if columns else [],
        "rows": rows,
    }
