"""Envoy admin `POST /logging`: the `active loggers:` body parsed, and level requests built and validated.

Sources (sample bodies in tests/envoy/data/logging.txt; real Envoy's in tests/envoy/test_real_envoy.py):
- envoyproxy/envoy `source/server/admin/logs_handler.cc` (`handlerLogging`, `changeLogLevel`,
  `changeLogLevelsForComponentLoggers`, `parseLogLevel`), `source/server/admin/admin.cc` (POST only),
  `source/common/common/logger.h` (`ALL_LOGGER_IDS`), `docs/root/operations/admin.rst` (/logging);
- istio/istio `manifests/charts/istio-control/istio-discovery/values.yaml` (sidecar defaults: `warning`,
  `misc:error`) and `istioctl/pkg/proxyconfig/proxyconfig.go` (`istioctl proxy-config log`: one
  `POST logging?<name>=<level>` per logger, or `logging?level=<level>`).

The logger set differs between Envoy builds, so names are validated against a list parsed from the proxy.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from urllib.parse import quote

from .clusters import FormatError

# spdlog's level names, the only spellings Envoy's parseLogLevel accepts (`warn` is rejected with
# "unknown logger level": the usage text in logging.txt lists exactly these).
LEVELS: tuple[str, ...] = ("trace", "debug", "info", "warning", "error", "critical", "off")

# Istio sidecar defaults (proxy logLevel warning, componentLogLevel misc:error).
ISTIO_DEFAULT_LEVEL = "warning"
ISTIO_DEFAULT_OVERRIDES: dict[str, str] = {"misc": "error"}

RESET = "reset"
_ACTIVE = "active loggers:"


class LevelError(ValueError):
    """A log level or logger name Envoy would reject; the message (one line) names the valid choices."""


def parse_logging(body: str) -> dict[str, str]:
    """The `active loggers:` list of a `/logging` response -> {logger: level} in Envoy's (enum) order.

    Error responses (HTTP 400) carry the list too, after `error: ...` and usage lines; fine-grain mode lists
    source files (`source/common/router/router.cc: warning`). A body without the list raises FormatError
    (e.g. the 405 `Method GET not allowed, POST required.`).
    """
    lines = body.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _ACTIVE)
    except StopIteration:
        first = next((line.strip() for line in lines if line.strip()), "")
        raise FormatError(f"not an Envoy /logging body: no '{_ACTIVE}' line; first line is {first[:60]!r}") \
            from None
    loggers: dict[str, str] = {}
    for line in lines[start + 1:]:
        name, sep, level = line.strip().rpartition(": ")
        if sep and name:
            loggers[name] = level.strip()
    return loggers


def logging_error(body: str) -> str | None:
    """The reason Envoy gave on a rejected request (`error: unknown logger name` -> "unknown logger name")."""
    for line in body.splitlines():
        if line.startswith("error: "):
            return line.removeprefix("error: ").strip()
        if line.strip() == _ACTIVE:
            break
    return None


def istio_defaults(loggers: Iterable[str]) -> dict[str, str]:
    """What each logger is set to on a fresh Istio sidecar."""
    return {name: ISTIO_DEFAULT_OVERRIDES.get(name, ISTIO_DEFAULT_LEVEL) for name in loggers}


def check_level(level: str) -> str:
    """The level in Envoy's spelling, or LevelError naming the valid ones."""
    normalized = level.strip().lower()
    if normalized in LEVELS:
        return normalized
    hint = " (Envoy spells it 'warning')" if normalized == "warn" else ""
    raise LevelError(f"unknown log level {level!r}{hint}: choose one of {', '.join(LEVELS)}")


def check_logger(name: str, loggers: Iterable[str] | None) -> str:
    """`name` if the proxy has that logger (exact match, as Envoy requires), else LevelError."""
    if loggers is None:
        return name
    known = list(loggers)
    if name in known:
        return name
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise LevelError(f"unknown logger {name!r}{hint}: valid loggers are {', '.join(known)}")


def parse_level_spec(spec: str, loggers: Iterable[str] | None = None) -> tuple[tuple[str | None, str], ...]:
    """`istioctl proxy-config log --level` syntax -> ((logger or None for all, level), ...).

    `debug` sets every logger; `http:debug,connection:trace` (or `http=debug`) sets those loggers; a bare
    level may lead a list (`warning,http:debug`). Everything is validated before anything is returned, as
    Envoy validates a `paths=` request before changing any level.
    """
    known = list(loggers) if loggers is not None else None
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise LevelError(f"empty log level: choose one of {', '.join(LEVELS)}, or <logger>:<level>")
    parsed: list[tuple[str | None, str]] = []
    for item in items:
        cut = min((i for i in (item.find(":"), item.find("=")) if i >= 0), default=-1)
        if cut < 0:
            parsed.append((None, check_level(item)))
        else:
            name, level = item[:cut].strip(), item[cut + 1:]
            parsed.append((check_logger(name, known), check_level(level)))
    # A bare level applied after named ones would silently undo them: make it go first.
    parsed.sort(key=lambda pair: pair[0] is not None)
    return tuple(parsed)


def _q(text: str) -> str:
    return quote(text, safe=":/,*?._-")


def log_level_queries(spec: str, loggers: Iterable[str] | None = None, *,
                      use_paths: bool = False) -> tuple[str, ...]:
    """Query strings for `POST /logging?<query>`, one POST each, in order.

    `spec` is `istioctl proxy-config log --level` input, or `reset` for Istio's defaults. By default every
    logger gets its own `<name>=<level>` POST, like istioctl (Envoy rejects two such parameters in one
    request); `use_paths` sends them as one `paths=a:l1,b:l2` request instead (current Envoy; atomic).
    """
    if spec.strip().lower() == RESET:
        known = None if loggers is None else set(loggers)
        overrides = [(n, lvl) for n, lvl in ISTIO_DEFAULT_OVERRIDES.items() if known is None or n in known]
        pairs: tuple[tuple[str | None, str], ...] = ((None, ISTIO_DEFAULT_LEVEL), *overrides)
    else:
        pairs = parse_level_spec(spec, loggers)
    queries = [f"level={level}" for name, level in pairs if name is None]
    named = [(name, level) for name, level in pairs if name is not None]
    if use_paths and named:
        queries.append("paths=" + _q(",".join(f"{name}:{level}" for name, level in named)))
    else:
        queries += [f"{_q(name)}={level}" for name, level in named]
    return tuple(queries)
