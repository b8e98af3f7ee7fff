"""Values that must not leave the machine in a report or on screen (docs/DESIGN.md, privacy).

Redaction judges a header the way Envoy reads it, not the way it is spelt: Envoy compares names
case-insensitively and rejects a name that is not a token (RFC 9110 section 5.1), so a name we cannot read as a
clean token (``Authorization\\x00``, `` Cookie``) may be a disguised credential and is hidden too. An obs-fold
continuation line (RFC 9112 section 5.2) is part of the header above it and is hidden with it. Tokens also
travel in request targets (OAuth ``?code=``, signed URLs), so their query values are hidden wherever a target is
shown.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

from kubectl_meshdoctor.envoy.log_format import SENSITIVE_HEADERS

if TYPE_CHECKING:
    from .findings import Finding

SENSITIVE_QUERY_PARAMS = frozenset({"token", "access_token", "code", "id_token", "refresh_token", "password",
                                    "api_key", "apikey", "key", "secret", "signature", "sig"})
REDACTED = "<redacted>"

_TCHAR = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_TOKEN = re.compile(f"[{_TCHAR}]+")
_NOT_TCHAR = re.compile(f"[^{_TCHAR}]")
# A query (or fragment: OAuth's implicit flow puts access_token there) parameter's name.
_PARAM_NAME = re.compile(r"[?&;#]([^=&;#?\s]*)=")
_VALUE_END = re.compile(r"[&#\s]")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def sensitive_name(name: str) -> bool:
    """Whether a header called ``name`` may carry a credential: a sensitive name in any case, or a name that is
    not a clean token and so cannot be trusted to be what it looks like."""
    return not _TOKEN.fullmatch(name) or name.lower() in SENSITIVE_HEADERS


def header_line(name: str, value: str, redact: bool = True) -> str:
    """``Name: value`` as on the wire, the value replaced for sensitive headers unless ``redact`` is False. A value
    holding a bare CR or LF is cut there: a parser that takes a bare LF for a line end (Envoy's can) reads what
    follows as another header, whose value may be a secret."""
    if redact and sensitive_name(name):
        value = REDACTED
    elif redact and ("\n" in value or "\r" in value):
        value = value.replace("\r", "\n").split("\n", 1)[0] + f"\\n{REDACTED}"
    return f"{name}: {value}"


def raw_line(line: str, redact: bool = True, owner: str | None = None) -> str:
    """A header line that did not parse as ``token: value``, as far as it can be shown.

    ``owner`` is the name of the field a continuation line (leading SP/HTAB) folds into; a continuation whose
    owner is unknown or sensitive is hidden. Any other line shows every byte of its name (up to the first colon:
    the bytes that broke it are the point, as the space of ``X-Bad : 1``) and none of its value; a line with no
    colon shows up to the first byte that is not a token character (what follows may be a value)."""
    if not redact:
        return line
    if line[:1] in (" ", "\t"):
        # Shown only when it folds into a harmless field and does not itself read as a sensitive one: a parser
        # that drops the leading whitespace (or the NULs in it) would see `` Cookie: ...`` as a Cookie.
        looks_like = _CONTROL.sub("", line.partition(":")[0]).lower()
        if owner is not None and not sensitive_name(owner) and looks_like not in SENSITIVE_HEADERS:
            # Cut at a bare CR or LF, as header_line does: what follows would read as a header of its own.
            return line if "\n" not in line and "\r" not in line else (
                line.replace("\r", "\n").split("\n", 1)[0] + f"\\n{REDACTED}")
        return line[:1] + REDACTED
    name, sep, value = line.partition(":")
    if sep and _TOKEN.fullmatch(name):
        return header_line(name, value.strip(" \t"), redact)
    if sep and "\n" not in name and "\r" not in name:  # a bare line end in it: what follows may read as a header
        return f"{name}: {REDACTED}"
    bad = _NOT_TCHAR.search(line)
    cut = bad.end() if bad else len(line)
    return line[:cut] + REDACTED


def redact_target(text: str, redact: bool = True) -> str:
    """``text`` (a request target, start line, access-log line or a sentence quoting one) with the values of
    credential-bearing query parameters replaced; their names stay, to show what was there."""
    if not redact or "=" not in text:
        return text
    out: list[str] = []
    done = 0
    # Names are looked for inside other values too (``?next=/cb?token=...``); a value runs to the next ``&``,
    # ``#`` or whitespace only, since stopping at quotes or backslashes would leak the rest of a value that
    # repr() escaped or that carried a stray quote.
    for m in _PARAM_NAME.finditer(text):
        if m.start() < done:
            continue
        end = _VALUE_END.search(text, m.end())
        if unquote_plus(m.group(1)).strip().lower() not in SENSITIVE_QUERY_PARAMS \
                and not _nested_secret(text[m.end():end.start() if end else len(text)]):
            continue
        out += [text[done:m.end()], REDACTED]
        done = end.start() if end else len(text)
    return "".join(out) + text[done:]


def _nested_secret(value: str) -> bool:
    """Whether a parameter's value, percent-decoded (up to three times, as nested redirects encode), holds a
    credential-bearing parameter of its own (``redirect_uri=https%3A%2F%2Fx%2Fcb%3Fcode%3D...``)."""
    # An unencoded nested parameter is found by the scan itself, which then hides its value alone.
    if "%" not in value or any(unquote_plus(m.group(1)).strip().lower() in SENSITIVE_QUERY_PARAMS
                               for m in _PARAM_NAME.finditer(value)):
        return False
    for _ in range(3):
        decoded = unquote_plus(value)
        if decoded == value:
            return False
        value = decoded
        if any(unquote_plus(m.group(1)).strip().lower() in SENSITIVE_QUERY_PARAMS
               for m in _PARAM_NAME.finditer(value)):
            return True
    return False


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact_target(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_scrub(v) for v in value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


# A header of Envoy's dumps (HeaderMapImpl::dumpState: `'name', 'value'`), in a debug line as logged, also inside
# a JSON line's msg (Istio's logAsJson keeps the dump in one line).
_DUMPED_HEADER = re.compile(r"'([^'\n]*)', '([^'\n]*)'")


def redact_dump(line: str) -> str:
    """A line of Envoy's own log with the values of sensitive headers in its header dumps hidden."""
    if "', '" not in line:
        return line
    return _DUMPED_HEADER.sub(lambda m: f"'{m.group(1)}', '{REDACTED}'" if sensitive_name(m.group(1))
                              else m.group(0), line)


def redact_finding(f: "Finding") -> "Finding":
    """``f`` with request-target tokens hidden in every text it carries. Done once where findings leave the
    pipeline, so a detector that quotes a path or an access-log line cannot forget it."""
    evidence = tuple(replace(e, what=redact_target(e.what)) if "=" in e.what else e for e in f.evidence)
    return replace(f, title=redact_target(f.title), evidence=evidence, explanation=redact_target(f.explanation),
                   remediation=redact_target(f.remediation),
                   response_code_details=redact_target(f.response_code_details),
                   access_log=tuple(redact_target(line) for line in f.access_log),
                   envoy_log=tuple(redact_target(redact_dump(line)) for line in f.envoy_log),
                   details=_scrub(f.details))
