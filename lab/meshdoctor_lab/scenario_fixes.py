"""The fixes each lab scenario's finding prints: what `lab up --fix NAME` and the lab tests apply.

The lab is an extra that knows none of the product (it is given a fix as data, lab/fixes.py); this is where the
two meet: the fixes come from the built-in detector of the scenario's failure, with the lab pod's ports and the
cause `watch` reads from the pod. The lab applies a fix's data as printed (its annotations and Istio fields); a
fix in the app or in the client is applied as the change its name stands for (lab/fixes.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kubectl_meshdoctor.core.fixes import Fix, named
from meshdoctor_lab.apps import ECHO_PORT, HTTP_PORT
from meshdoctor_lab.applied_fixes import LAB_FIXES, LabFix
from meshdoctor_lab.scenarios.table import (
    SLOW_CALLER_GIVES_UP,
    SLOW_ROUTE_TIMEOUT,
    STALE_IDLE_TIMEOUT,
)
from kubectl_meshdoctor.lint.sidecar import inject_fix
from kubectl_meshdoctor_plugins import (
    circuit_breaker_overflow,
    conntrack_invalid,
    downstream_disconnect,
    downstream_protocol_error,
    http_framing,
    no_healthy_upstream,
    no_route,
    server_first_protocol,
    source_port_exhaustion,
    stale_keepalive,
    tls_mismatch,
    tuple_collision,
    upstream_goaway,
    upstream_refused,
    upstream_timeout,
)

# scenario -> the fixes its finding prints, in the order printed
SCENARIO_FIXES: dict[str, Callable[[], tuple[Fix, ...]]] = {
    "collision": lambda: tuple_collision.fixes(ECHO_PORT),  # the round's second connection dials the echo port
    "remap": lambda: tuple_collision.fixes(ECHO_PORT),
    # watch reads the pod's listening sockets, so the live finding knows the cause
    "refused": lambda: upstream_refused.fixes(HTTP_PORT, "not-listening"),
    "refused-localhost": lambda: upstream_refused.fixes(HTTP_PORT, "bound-to-localhost"),
    "framing": lambda: http_framing.FIXES,
    # the app announces its keep-alive timeout (Keep-Alive: timeout=N), which the fix stays below
    "stale-keepalive": lambda: stale_keepalive.fixes(STALE_IDLE_TIMEOUT),
    "port-exhaustion": lambda: source_port_exhaustion.FIXES,
    "downstream-idle": lambda: stale_keepalive.CALLER_FIXES,
    # Envoy waits the route's timeout, to the millisecond as it logs it; one caller gives up, another half-closes
    "slow-app": lambda: (*upstream_timeout.fixes(int(SLOW_ROUTE_TIMEOUT * 1000), per_try=False),
                         *downstream_disconnect.fixes(int(SLOW_CALLER_GIVES_UP * 1000)),
                         *downstream_disconnect.fixes(0)),
    "goaway": lambda: upstream_goaway.FIXES,
    # three failures in one round, each with its own fixes
    "http10": lambda: tuple(f for fixes in downstream_protocol_error.FIXES.values() for f in fixes),
    "overflow": lambda: circuit_breaker_overflow.FIXES,
    "outlier": lambda: no_healthy_upstream.FIXES,
    "no-route": lambda: no_route.FIXES,
    # the plaintext caller dials the app port, STRICT on the pod; the sidecar originates mTLS to a plain app
    "mtls-strict": lambda: (tls_mismatch.permissive_fix(HTTP_PORT),),
    "tls-to-plaintext": lambda: (tls_mismatch.TLS_DISABLE,),
    # lint's no-sidecar: the pod opts out of injection (tests/lab/test_lint_lab.py proves its fix)
    "no-sidecar": lambda: (inject_fix("<namespace>", opted_out=True),),
    # istio-init's INVALID_DROP rule, or the pod namespace's conntrack judging no windows
    "conntrack-invalid": conntrack_invalid.fixes,
    # the callers dial the server-first app's port (5002): declared TCP, the sidecar relays its greeting
    "server-first": lambda: server_first_protocol.fixes(ECHO_PORT),
    # the app stops reusing its source port (the caller's finding, on its lo)
    "outbound-stale": tuple_collision.outbound_fixes,
}


def printed_fixes(scenario: str) -> tuple[Fix, ...]:
    """The fixes a finding of ``scenario`` prints (empty when none is proven in the lab yet)."""
    make = SCENARIO_FIXES.get(scenario)
    return make() if make else ()


def fix_names(scenario: str) -> tuple[str, ...]:
    """The names ``lab up --fix`` takes for ``scenario``: its finding's fixes, else the lab's own (LAB_FIXES)."""
    return tuple(f.name for f in printed_fixes(scenario)) or tuple(f.name for f in LAB_FIXES.get(scenario, ()))


def lab_fix(scenario: str, name: str) -> LabFix:
    """The fix ``name`` of ``scenario``, as the lab is given it. Raises KeyError naming the scenario's fixes.

    A scenario whose class no detector prints fixes for yet has the lab's own (lab/fixes.py LAB_FIXES), which
    the lab tests prove; once its finding prints fixes, those are the ones."""
    fixes = printed_fixes(scenario)
    own = {fix.name: fix for fix in LAB_FIXES.get(scenario, ())}
    if not fixes and own:
        if name not in own:
            raise KeyError(f"scenario {scenario} has no fix {name!r} (its fixes: {', '.join(own)})")
        return own[name]
    if not fixes:
        raise KeyError(f"scenario {scenario} has no fix {name!r} (nothing there prints a fix); fix one pod "
                       f"only with --fix POD={name}")
    try:
        fix = named(fixes, name)
    except KeyError:
        raise KeyError(f"scenario {scenario} has no fix {name!r} (its fixes: "
                       f"{', '.join(f.name for f in fixes)})") from None
    return LabFix(fix.name, fix.annotations, fix.settings, fix.labels)
