"""Fault injection: a table the tests set through `POST /_lab/faults` to make the server misbehave on purpose.

Format (every key optional; unknown keys are rejected so that a typo does not silently inject nothing):

    {"get_pod" | "list_pods" | "get_deployment" | "patch_ephemeralcontainers" | "exec" | "attach" | "portforward"
       | "log" | "ssar" | "ssrr": {"status": 403, "message": "...", "reason": "Forbidden", "delay_s": 0.5, "times": 1},
     "exec": {"drop_after_bytes": 65536, "times": 1, ...} | {"drop_at_stdin_close": true, ...},
     "ephemeral_start": {"delay_s": 2.0} | {"waiting_reason": "ImagePullBackOff", "message": "..."},
     "deny": [{"verb": "create", "resource": "pods", "subresource": "exec"}]}

`status` answers the request with that HTTP code and a Status body; `delay_s` waits first (seconds);
`times` makes the fault apply to that many requests and then vanish (absent = forever). `drop_after_bytes`
aborts an exec stream's connection after that many stdout bytes were sent (no status, no close frame);
`drop_at_stdin_close` cuts it the same way when the client half-closes stdin (a stream lost while stopping).
`deny` entries make SelfSubjectAccessReview answer allowed=false and the matching requests fail with 403 as RBAC
would; an entry matches when each key it has (verb, resource, subresource, group, namespace, name) is equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

OPERATIONS = ("get_pod", "list_pods", "get_deployment", "patch_ephemeralcontainers", "exec", "attach", "portforward",
              "log", "ssar", "ssrr")
_RULE_KEYS = frozenset({"status", "message", "reason", "delay_s", "times", "drop_after_bytes",
                        "drop_at_stdin_close"})
_DENY_KEYS = frozenset({"verb", "resource", "subresource", "group", "namespace", "name"})


class FaultSpecError(ValueError):
    """The faults JSON is malformed; the message says where."""


def _flag(rule: Mapping[str, Any], key: str) -> bool:
    value = rule.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(f"{key} takes true or false, not {value!r}")
    return value


@dataclass
class FaultRule:
    status: int | None = None
    message: str | None = None
    reason: str | None = None
    delay_s: float = 0.0
    times: int | None = None
    drop_after_bytes: int | None = None
    drop_at_stdin_close: bool = False


@dataclass(frozen=True)
class Deny:
    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    group: str | None = None
    namespace: str | None = None
    name: str | None = None

    def matches(self, **attrs: str) -> bool:
        for key in _DENY_KEYS:
            want = getattr(self, key)
            if want is not None and want != (attrs.get(key) or ""):
                return False
        return True


@dataclass
class Faults:
    rules: dict[str, FaultRule] = field(default_factory=dict)
    deny: tuple[Deny, ...] = ()
    ephemeral_start_delay_s: float = 0.0
    ephemeral_waiting_reason: str | None = None
    ephemeral_waiting_message: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any) -> "Faults":
        """Raises FaultSpecError on anything not in the format above."""
        if not isinstance(data, Mapping):
            raise FaultSpecError("faults must be a JSON object")
        out = cls(raw=dict(data))
        for key, value in data.items():
            if key == "deny":
                if not isinstance(value, list):
                    raise FaultSpecError("deny must be a list")
                entries = []
                for entry in value:
                    if not isinstance(entry, Mapping) or not set(entry) <= _DENY_KEYS:
                        raise FaultSpecError(f"deny entries take only {sorted(_DENY_KEYS)}: {entry!r}")
                    entries.append(Deny(**{k: str(v) for k, v in entry.items()}))
                out.deny = tuple(entries)
            elif key == "ephemeral_start":
                if not isinstance(value, Mapping) or not set(value) <= {"delay_s", "waiting_reason", "message"}:
                    raise FaultSpecError("ephemeral_start takes delay_s, waiting_reason, message")
                out.ephemeral_start_delay_s = float(value.get("delay_s", 0.0))
                out.ephemeral_waiting_reason = value.get("waiting_reason")
                out.ephemeral_waiting_message = value.get("message")
            elif key in OPERATIONS:
                if not isinstance(value, Mapping) or not set(value) <= _RULE_KEYS:
                    raise FaultSpecError(f"{key} takes only {sorted(_RULE_KEYS)}")
                try:
                    out.rules[key] = FaultRule(
                        status=int(value["status"]) if "status" in value else None,
                        message=value.get("message"),
                        reason=value.get("reason"),
                        delay_s=float(value.get("delay_s", 0.0)),
                        times=int(value["times"]) if "times" in value else None,
                        drop_after_bytes=int(value["drop_after_bytes"]) if "drop_after_bytes" in value else None,
                        drop_at_stdin_close=_flag(value, "drop_at_stdin_close"),
                    )
                except (TypeError, ValueError) as exc:
                    raise FaultSpecError(f"{key}: {exc}") from None
            else:
                raise FaultSpecError(f"unknown fault {key!r}; known: {[*OPERATIONS, 'deny', 'ephemeral_start']}")
        return out

    def take(self, operation: str) -> FaultRule | None:
        """The rule for `operation`, consuming one of its `times`; None when there is none (left)."""
        rule = self.rules.get(operation)
        if rule is None:
            return None
        if rule.times is not None:
            rule.times -= 1
            if rule.times <= 0:
                del self.rules[operation]
        return rule

    def denied(self, verb: str, resource: str, subresource: str = "", group: str = "", namespace: str = "",
               name: str = "") -> bool:
        return any(d.matches(verb=verb, resource=resource, subresource=subresource, group=group,
                             namespace=namespace, name=name) for d in self.deny)
