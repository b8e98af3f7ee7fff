"""Pods from a file instead of the API server (``lint -f``): what ``kubectl get pod -o yaml|json`` wrote, a
saved manifest, or a Pod merged with a fix by ``kubectl patch --local``.

A file is JSON (one object, or several one after another, as kubectl reads them) or YAML (one or more
documents); each is a Pod or a List of them. The shapes lint reads are checked here as the API server checks
them, so a malformed Pod is one line naming its field, not a crash deep in a rule.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's loader when built with it: ~4x faster


# YAML aliases a file may use: a Kubernetes manifest has few or none, and a few thousand, each expanded where it
# is used, can build gigabytes from kilobytes (a "billion laughs"); kubectl's reader refuses such aliasing too.
MAX_ALIASES = 1000
_ALIAS = re.compile(r"(?:^|[\s\[{,:-])\*[^\s,\]}]")


def _aliases(text: str) -> int:
    """How many alias uses the YAML in ``text`` has (its events parsed, nothing built)."""
    if not _ALIAS.search(text):
        return 0
    return sum(isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(text, Loader=_LOADER))


def _documents(text: str, where: str) -> list[Any]:
    if text.lstrip()[:1] in ("{", "["):
        try:  # JSON objects one after another, as `kubectl get -o json` output concatenated
            decoder, docs, at = json.JSONDecoder(), [], 0
            while (at := len(text) - len(text[at:].lstrip())) < len(text):
                doc, at = decoder.raw_decode(text, at)
                docs.append(doc)
            return docs
        except RecursionError:
            raise ValueError(f"{where} nests too deeply for a Pod (over {sys.getrecursionlimit()} levels)") from None
        except ValueError:
            pass  # YAML's flow style starts so too
    try:
        if (n := _aliases(text)) > MAX_ALIASES:
            raise ValueError(f"{where} uses {n} YAML aliases (at most {MAX_ALIASES}): not a manifest lint reads")
        return [d for d in yaml.load_all(text, Loader=_LOADER) if d is not None]
    except ValueError as e:
        if str(e).startswith(where):
            raise
        raise ValueError(f"{where} holds a value no Pod can have ({str(e).split(':')[0]})") from None
    except RecursionError:
        raise ValueError(f"{where} nests too deeply for a Pod (over {sys.getrecursionlimit()} levels)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{where} is not YAML or JSON{at}") from None


def _kind(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("kind") or "an object without a kind")
    return {list: "a list", str: "a string"}.get(type(obj), f"a {type(obj).__name__}")


def _mapping(value: Any, path: str, of_strings: bool = False) -> str | None:
    """What is wrong with ``value`` at ``path`` as a mapping (of strings), None when nothing (or it is absent)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"{path} must be a mapping"
    bad = next((k for k, v in value.items() if not isinstance(v, str)), None) if of_strings else None
    return None if bad is None else f"{path}[{json.dumps(str(bad))}] must be a string (a YAML block: key: |)"


def _items(value: Any, path: str) -> str | None:
    if value is None or (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
        return None
    return f"{path} must be a list of mappings"


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else []


def _container_problems(c: dict, path: str) -> list[str | None]:
    out = [_items(c.get(f), f"{path}.{f}") for f in ("ports", "env")]
    out += [_mapping(c.get(f), f"{path}.{f}") for f in
            ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resources", "securityContext")]
    for f in ("args", "command"):
        if c.get(f) is not None and not (isinstance(c[f], list) and all(isinstance(a, str) for a in c[f])):
            out.append(f"{path}.{f} must be a list of strings")
    for j, port in enumerate(_listed(c.get("ports"))):
        number = port.get("containerPort") if isinstance(port, dict) else None
        if isinstance(number, int) and not 0 < number < 65536:
            out.append(f"{path}.ports[{j}].containerPort must be between 1 and 65535")
    hooks = c.get("lifecycle") if isinstance(c.get("lifecycle"), dict) else {}
    out += [_mapping(hooks.get(h), f"{path}.lifecycle.{h}") for h in ("postStart", "preStop")]
    return out


def _status_problems(st: dict, path: str) -> list[str | None]:
    out = [] if isinstance(st.get("restartCount", 0), int) else [f"{path}.restartCount must be a number"]
    for f in ("state", "lastState"):
        out.append(_mapping(st.get(f), f"{path}.{f}"))
        inner = st.get(f) if isinstance(st.get(f), dict) else {}
        out += [_mapping(value, f"{path}.{f}.{name}") for name, value in inner.items()]
    return out


def _problem(pod: dict) -> str | None:
    """The first field of ``pod`` whose type the API server would refuse, among those lint reads."""
    meta, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status")
    checks = [_mapping(meta, "metadata"), _mapping(spec, "spec"), _mapping(status, "status")]
    if isinstance(meta, dict):
        checks += [_mapping(meta.get("annotations"), "metadata.annotations", True),
                   _mapping(meta.get("labels"), "metadata.labels", True)]
    for key in ("containers", "initContainers") if isinstance(spec, dict) else ():
        checks.append(_items(spec.get(key), f"spec.{key}"))
        checks += [p for i, c in enumerate(_listed(spec.get(key))) if isinstance(c, dict)
                   for p in _container_problems(c, f"spec.{key}[{i}]")]
    for key in ("containerStatuses", "initContainerStatuses") if isinstance(status, dict) else ():
        checks.append(_items(status.get(key), f"status.{key}"))
        checks += [p for i, st in enumerate(_listed(status.get(key))) if isinstance(st, dict)
                   for p in _status_problems(st, f"status.{key}[{i}]")]
    return next((c for c in checks if c), None)


def pods_of_file(path: str) -> list[dict]:
    """The Pods in a YAML or JSON file (``-``: stdin), each document a Pod or a List of them (as ``kubectl get
    pods -o yaml`` writes). Raises ValueError naming the file (and the field) for anything else."""
    where = "stdin" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {where}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not text (UTF-8): not a YAML or JSON manifest") from None
    pods = []
    for n, doc in enumerate(_documents(text, where), start=1):
        listed = isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List")
        members = doc.get("items") if listed else [doc]
        if listed and members is not None and not isinstance(members, list):
            raise ValueError(f"{where}: document {n}: items must be a list")
        for item in members or ():
            if _kind(item) != "Pod":
                raise ValueError(f"{where}: lint reads Pods, not {_kind(item)} (a Deployment's template is not "
                                 f"injected yet: lint its pods)")
            problem = _problem(item)
            if problem:
                name = (item.get("metadata") or {}).get("name", "?") if isinstance(item.get("metadata"), dict) \
                    else "?"
                raise ValueError(f"{where}: pod {name}: {problem}")
            pods.append(item)
    if not pods:
        raise ValueError(f"{where} holds no Pod")
    return pods
