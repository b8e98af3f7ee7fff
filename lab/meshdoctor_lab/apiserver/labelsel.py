"""Label and field selectors as the API server parses them (`app=x,version!=v2,env in (a,b),!canary`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_OP_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


class SelectorError(ValueError):
    """The selector text does not parse; the message is the API's wording."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return has and value == self.values[0]
        if self.op == "!=":
            return not has or value != self.values[0]
        if self.op == "in":
            return has and value in self.values
        if self.op == "notin":
            return not has or value not in self.values
        if self.op == "exists":
            return has
        return not has


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside `( )`."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """Raises SelectorError on text the API would reject."""
    reqs = []
    for part in _split_top(text or ""):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _OP_RE.match(part):
            op = "=" if m.group(2) == "==" else m.group(2)
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
    return tuple(reqs)


def label_matcher(text: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over a labels dict; the empty selector matches everything."""
    reqs = parse_label_selector(text or "")
    return lambda labels: all(r.matches(labels) for r in reqs)


# Field selectors the pod list supports on a real server (a subset that covers the usual queries).
_POD_FIELDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "metadata.namespace": lambda o: o["metadata"]["namespace"],
    "spec.nodeName": lambda o: o["spec"].get("nodeName", ""),
    "spec.restartPolicy": lambda o: o["spec"].get("restartPolicy", ""),
    "status.phase": lambda o: o["status"].get("phase", ""),
    "status.podIP": lambda o: o["status"].get("podIP", ""),
}


# The Event fields a real server selects on (pkg/registry/core/event/strategy.go ToSelectableFields).
_EVENT_FIELDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "metadata.namespace": lambda o: o["metadata"]["namespace"],
    **{f"involvedObject.{k}": (lambda k: lambda o: str(o["involvedObject"].get(k, "")))(k)
       for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
    "reason": lambda o: o.get("reason", ""),
    "reportingComponent": lambda o: o.get("reportingComponent", ""),
    "source": lambda o: (o.get("source") or {}).get("component", ""),
    "type": lambda o: o.get("type", ""),
}


def field_matcher(text: str | None, kind: str = "Pod") -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over an object for `fieldSelector`; raises SelectorError on unknown fields."""
    reqs = []
    for part in _split_top(text or ""):
        m = _OP_RE.match(part)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part.strip()}'")
        key, op, value = m.group(1), m.group(2), m.group(3)
        getter = _POD_FIELDS.get(key) if kind == "Pod" else _EVENT_FIELDS.get(key) if kind == "Event" else (
            _POD_FIELDS[key] if key in ("metadata.name", "metadata.namespace") else None)
        if getter is None:
            raise SelectorError(f'field label not supported: {key}')
        reqs.append((getter, op != "!=", value))
    return lambda obj: all((g(obj) == v) == eq for g, eq, v in reqs)
