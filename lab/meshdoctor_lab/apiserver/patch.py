"""PATCH of the `pods/ephemeralcontainers` subresource: decode the three patch types, validate like the API.

Only `spec.ephemeralContainers` of the patched Pod is used (the real subresource ignores every other change).
Errors are raised as `ApiError` carrying the HTTP code and the Status body the real API server would send.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

from .status import status_failure

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
ACCEPTED = (JSON_PATCH, MERGE, "application/apply-patch+yaml", STRATEGIC)

# Every field of core/v1 EphemeralContainerCommon; others are dropped with a warning (fieldValidation=Warn,
# the server default when the client does not ask for Strict).
KNOWN_FIELDS = frozenset({
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources", "resizePolicy",
    "restartPolicy", "restartPolicyRules", "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe",
    "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy",
    "securityContext", "stdin", "stdinOnce", "tty", "targetContainerName",
})
FORBIDDEN_FIELDS = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resizePolicy",
                    "restartPolicy", "restartPolicyRules")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ApiError(Exception):
    """An API failure: HTTP `code` and the metav1.Status `body` to send."""

    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body


@dataclass(frozen=True)
class FieldError:
    field: str
    kind: str  # "Duplicate value", "Not found", "Forbidden", "Required value", "Invalid value"
    detail: str = ""
    value: Any = None

    _REASONS = {
        "Duplicate value": "FieldValueDuplicate",
        "Not found": "FieldValueNotFound",
        "Forbidden": "FieldValueForbidden",
        "Required value": "FieldValueRequired",
        "Invalid value": "FieldValueInvalid",
    }

    def text(self) -> str:
        """The short form without the field path, as in Status `details.causes[].message`."""
        if self.kind in ("Duplicate value", "Not found"):
            return f"{self.kind}: {json.dumps(self.value)}"
        if self.kind == "Invalid value":
            return f"{self.kind}: {json.dumps(self.value)}: {self.detail}"
        return f"{self.kind}: {self.detail}" if self.detail else self.kind

    def cause(self) -> dict[str, str]:
        return {"reason": self._REASONS[self.kind], "message": self.text(), "field": self.field}


def invalid(pod_name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid with the aggregate message shape `Pod "x" is invalid: [a, b]`."""
    parts = [f"{e.field}: {e.text()}" for e in errors]
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(422, status_failure(
        422, f'Pod "{pod_name}" is invalid: {summary}',
        details={"name": pod_name, "kind": "Pod", "causes": [e.cause() for e in errors]}))


def bad_request(message: str) -> ApiError:
    return ApiError(400, status_failure(400, message))


# ------------------------------------------------------------------------------------------- patch decoding


def _strip_directives(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if not k.startswith("$")}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 merge (null deletes a key); strategic merge treats the maps inside a container the same way."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _strategic(existing: list[dict[str, Any]], body: Any) -> list[Any]:
    if not isinstance(body, dict):
        raise bad_request("the body of the request was in an unknown format: a strategic merge patch must be an object")
    spec = body.get("spec")
    if not isinstance(spec, dict) or "ephemeralContainers" not in spec:
        return copy.deepcopy(existing)
    patch_list = spec["ephemeralContainers"]
    if patch_list is None:
        return []
    if not isinstance(patch_list, list):
        raise bad_request("spec.ephemeralContainers: expected a list")
    out: list[Any] = copy.deepcopy(existing)
    for entry in patch_list:
        if not isinstance(entry, dict):
            out.append(entry)  # rejected by validation
            continue
        name = entry.get("name")
        index = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get("name") == name), None)
        if entry.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
        elif index is not None:
            out[index] = _merge(out[index], entry)
        else:
            out.append(_strip_directives(entry))
    return out


def _merge_patch(existing: list[dict[str, Any]], body: Any) -> list[Any]:
    if not isinstance(body, dict):
        raise bad_request("the body of the request was in an unknown format: a merge patch must be an object")
    spec = body.get("spec")
    if not isinstance(spec, dict) or "ephemeralContainers" not in spec:
        return copy.deepcopy(existing)
    value = spec["ephemeralContainers"]
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("spec.ephemeralContainers: expected a list")
    return copy.deepcopy(value)


class _PointerError(Exception):
    pass


def _parse_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _PointerError(f'invalid JSON pointer: "{path}"')
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _walk(doc: Any, tokens: list[str], path: str) -> Any:
    for tok in tokens:
        if isinstance(doc, dict) and tok in doc:
            doc = doc[tok]
        elif isinstance(doc, list) and tok.isdigit() and int(tok) < len(doc):
            doc = doc[int(tok)]
        else:
            raise _PointerError(f'doc is missing path: "{path}": missing value')
    return doc


def _json_patch_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, path = op.get("op"), op.get("path")
    if not isinstance(path, str):
        raise _PointerError(f"{kind} operation missing path")
    tokens = _parse_pointer(path)
    if kind in ("add", "replace", "test") and "value" not in op:
        raise _PointerError(f"{kind} operation missing value")
    if kind == "test":
        if _walk(doc, tokens, path) != op["value"]:
            raise _PointerError(f'testing value {path} failed: test failed')
        return doc
    if kind in ("move", "copy"):
        source = _parse_pointer(str(op.get("from", "")))
        value = copy.deepcopy(_walk(doc, source, str(op.get("from"))))
        if kind == "move":
            doc = _json_patch_op(doc, {"op": "remove", "path": op["from"]})
        return _json_patch_op(doc, {"op": "add", "path": path, "value": value})
    if not tokens:
        if kind in ("add", "replace"):
            return copy.deepcopy(op["value"])
        raise _PointerError("unable to remove the whole document")
    parent = _walk(doc, tokens[:-1], path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif last not in parent:
            raise _PointerError(f'{kind} operation does not apply: doc is missing key: {path}: missing value')
        elif kind == "remove":
            del parent[last]
        elif kind == "replace":
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise _PointerError(f'Unexpected kind: {kind}')
        return doc
    if isinstance(parent, list):
        if kind == "add" and last == "-":
            parent.append(copy.deepcopy(op["value"]))
            return doc
        if not last.isdigit():
            raise _PointerError(f'{kind} operation does not apply: doc is missing path: "{path}": missing value')
        index = int(last)
        if kind == "add":
            if index > len(parent):
                raise _PointerError(f'add operation does not apply: doc is missing path: "{path}": missing value')
            parent.insert(index, copy.deepcopy(op["value"]))
        elif index >= len(parent):
            raise _PointerError(f'{kind} operation does not apply: doc is missing path: "{path}": missing value')
        elif kind == "remove":
            parent.pop(index)
        elif kind == "replace":
            parent[index] = copy.deepcopy(op["value"])
        else:
            raise _PointerError(f'Unexpected kind: {kind}')
        return doc
    raise _PointerError(f'{kind} operation does not apply: doc is missing path: "{path}": missing value')


def _json_patch(pod: dict[str, Any], body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise bad_request("the body of the request was in an unknown format: a JSON patch must be a list of operations")
    doc = copy.deepcopy(pod)
    try:
        for op in body:
            if not isinstance(op, dict):
                raise _PointerError("invalid JSON patch operation")
            doc = _json_patch_op(doc, op)
    except _PointerError as exc:
        # The API server answers failed JSON patch operations with 422 and the patch library's message.
        raise ApiError(422, status_failure(422, str(exc), reason="Invalid")) from None
    spec = doc.get("spec") if isinstance(doc, dict) else None
    value = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("spec.ephemeralContainers: expected a list")
    return value


# ------------------------------------------------------------------------------------------- defaults, checks


def default_pull_policy(image: str) -> str:
    """Always for `:latest` or no tag, else IfNotPresent (a digest counts as pinned)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    if ":" not in last or last.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def with_defaults(entry: dict[str, Any]) -> dict[str, Any]:
    """Apply the server-side defaults a stored ephemeral container shows in GET output."""
    out = dict(entry)
    if isinstance(out.get("image"), str) and not out.get("imagePullPolicy"):
        out["imagePullPolicy"] = default_pull_policy(out["image"])
    out.setdefault("terminationMessagePath", "/dev/termination-log")
    out.setdefault("terminationMessagePolicy", "File")
    out.setdefault("resources", {})
    return out


def _type_check(i: int, entry: dict[str, Any]) -> None:
    """Reject bodies the API could not even decode (400, Go's unmarshal wording)."""
    for key in ("name", "image", "workingDir", "targetContainerName", "imagePullPolicy",
                "terminationMessagePath", "terminationMessagePolicy"):
        if key in entry and entry[key] is not None and not isinstance(entry[key], str):
            raise bad_request(f"json: cannot unmarshal {type(entry[key]).__name__} into Go struct field "
                              f"EphemeralContainer.spec.ephemeralContainers.{key} of type string")
    for key in ("command", "args"):
        value = entry.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(a, str) for a in value)):
            raise bad_request(f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                              f"EphemeralContainer.spec.ephemeralContainers.{key} of type []string")


def decode_and_validate(
    pod_name: str,
    pod: dict[str, Any],
    content_type: str,
    raw: bytes,
    existing: list[dict[str, Any]],
    container_names: Iterable[str],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Apply a PATCH body to the pod's ephemeral containers.

    `pod` is the current Pod JSON (for JSON patch paths), `existing` the stored ephemeral containers,
    `container_names` the names in spec.containers and spec.initContainers. Returns the new full list (defaults
    applied) and warning texts for dropped unknown fields. Raises ApiError (400, 415, 422).
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in (STRATEGIC, MERGE, JSON_PATCH):
        raise ApiError(415, status_failure(
            415, "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(ACCEPTED)))
    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise bad_request(f"error decoding patch: {exc}") from None
    if media == STRATEGIC:
        new = _strategic(existing, body)
    elif media == MERGE:
        new = _merge_patch(existing, body)
    else:
        new = _json_patch(pod, body)

    warnings: list[str] = []
    entries: list[dict[str, Any]] = []
    for i, entry in enumerate(new):
        if not isinstance(entry, dict):
            raise bad_request("json: cannot unmarshal into Go struct field PodSpec.spec.ephemeralContainers of type "
                              "core.EphemeralContainer")
        _type_check(i, entry)
        for key in sorted(entry):
            if key not in KNOWN_FIELDS:
                warnings.append(f'unknown field "spec.ephemeralContainers[{i}].{key}"')
        entries.append(with_defaults({k: v for k, v in entry.items() if k in KNOWN_FIELDS and v is not None}))

    errors: list[FieldError] = []
    by_name: dict[Any, dict[str, Any]] = {}
    for e in entries:
        by_name.setdefault(e.get("name"), e)  # first wins: a later duplicate is reported as such below
    for old in existing:
        if old["name"] not in by_name:
            errors.append(FieldError("spec.ephemeralContainers", "Forbidden",
                                     f'existing ephemeral containers "{old["name"]}" may not be removed'))
        elif by_name[old["name"]] != old:
            errors.append(FieldError("spec.ephemeralContainers", "Forbidden",
                                     f'existing ephemeral containers "{old["name"]}" may not be changed'))
    seen = set(container_names)
    targets = set(container_names)
    old_names = {o["name"] for o in existing}
    for i, entry in enumerate(entries):
        path = f"spec.ephemeralContainers[{i}]"
        name = entry.get("name")
        if not name:
            errors.append(FieldError(f"{path}.name", "Required value"))
        elif not _DNS1123_LABEL.match(name) or len(name) > 63:
            errors.append(FieldError(
                f"{path}.name", "Invalid value",
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')", name))
        elif name in seen:
            errors.append(FieldError(f"{path}.name", "Duplicate value", value=name))
        if name:
            seen.add(name)
        if name in old_names:
            continue  # stored entries were validated when they were added
        if not entry.get("image"):
            errors.append(FieldError(f"{path}.image", "Required value"))
        target = entry.get("targetContainerName")
        if target and target not in targets:
            errors.append(FieldError(f"{path}.targetContainerName", "Not found", value=target))
        for key in FORBIDDEN_FIELDS:
            if key in entry:
                errors.append(FieldError(f"{path}.{key}", "Forbidden", "cannot be set for an Ephemeral Container"))
        if entry.get("resources"):
            errors.append(FieldError(f"{path}.resources", "Forbidden", "cannot be set for an Ephemeral Container"))
    if errors:
        raise invalid(pod_name, errors)
    return entries, warnings


def apply_json_patch(doc: Any, ops: Any) -> Any:
    """``doc`` with RFC 6902 ``ops`` applied (a deep copy); raises ValueError naming the failing operation."""
    out = copy.deepcopy(doc)
    try:
        for op in ops:
            out = _json_patch_op(out, op)
    except _PointerError as exc:
        raise ValueError(str(exc)) from None
    return out
