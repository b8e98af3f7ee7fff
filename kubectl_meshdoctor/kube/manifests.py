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


def _problem(pod: dict) -> str | None:
    """The first field of ``pod`` whose type the API server would refuse, among those lint reads."""
    def mapping(value: Any, path: str, of_strings: bool = False) -> str | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            return f"{path} must be a mapping"
        if of_strings:
            bad = next((k for k, v in value.items() if not isinstance(v, str)), None)
            if bad is not None:
                return f"{path}[{json.dumps(str(bad))}] must be a string (a YAML block: key: |)"
        return None

    def items(value: Any, path: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            return f"{path} must be a list of mappings"
        return None

    meta, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status")
    checks = [mapping(meta, "metadata"), mapping(spec, "spec"), mapping(status, "status")]
    if isinstance(meta, dict):
        checks += [mapping(meta.get("annotations"), "metadata.annotations", True),
                   mapping(meta.get("labels"), "metadata.labels", True)]
    if isinstance(spec, dict):
        for key in ("containers", "initContainers"):
            checks.append(items(spec.get(key), f"spec.{key}"))
            for i, c in enumerate(spec.get(key) if isinstance(spec.get(key), list) else []):
                if isinstance(c, dict):
                    checks += _container_problems(c, f"spec.{key}[{i}]", mapping, items)
    if isinstance(status, dict):
        for key in ("containerStatuses", "initContainerStatuses"):
            checks.append(items(status.get(key), f"status.{key}"))
            for i, st in enumerate(status.get(key) if isinstance(status.get(key), list) else []):
                if not isinstance(st, dict):
                    continue
                where = f"status.{key}[{i}]"
                if not isinstance(st.get("restartCount", 0), int):
                    checks.append(f"{where}.restartCount must be a number")
                for f in ("state", "lastState"):
                    checks.append(mapping(st.get(f), f"{where}.{f}"))
                    for inner, value in (st.get(f) or {}).items() if isinstance(st.get(f), dict) else ():
                        checks.append(mapping(value, f"{where}.{f}.{inner}"))
    return next((c for c in checks if c), None)


def _container_problems(c: dict, path: str, mapping, items) -> list[str | None]:
    out = [items(c.get(f), f"{path}.{f}") for f in ("ports", "env")]
    out += [mapping(c.get(f), f"{path}.{f}") for f in
            ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resources", "securityContext")]
    for f in ("args", "command"):
        if c.get(f) is not None and not (isinstance(c[f], list) and all(isinstance(a, str) for a in c[f])):
            out.append(f"{path}.{f} must be a list of strings")
    for j, port in enumerate(c.get("ports") if isinstance(c.get("ports"), list) else []):
        number = port.get("containerPort") if isinstance(port, dict) else None
        if number is not None and isinstance(number, int) and not 0 < number < 65536:
            out.append(f"{path}.ports[{j}].containerPort must be between 1 and 65535")
    hooks = c.get("lifecycle") if isinstance(c.get("lifecycle"), dict) else {}
    out += [mapping(hooks.get(h), f"{path}.lifecycle.{h}") for h in ("postStart", "preStop")]
    return out


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
