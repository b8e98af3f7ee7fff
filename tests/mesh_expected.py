"""What each hop of the lab's mesh scenarios can show (the caller sidecar talking Istio mTLS to the pod's sidecar,
real Envoy 1.40 at both): the recordings' (tests/commands/test_analyze_mesh.py, tests/data/envoy-1.40-mesh) and
the live lab's (tests/lab/test_mesh_watch.py) expectations, one table for both."""

from __future__ import annotations

INVENTED = frozenset({"access-log", "syn-timeout"})  # what a mesh's two views must not make up


def invented(case: tuple[str, str]) -> frozenset[str]:
    """The classes of INVENTED the case's failure is not: what neither pod's files may name."""
    return INVENTED - {c[0] for want in EXPECTED[case] for c in want}

NEXT = ("next-hop", "error")

# (recordings, scenario) -> what the caller's files name, what the server's name, and, read together, each
# (detector, severity, pod) of the findings.
EXPECTED = {
    ("envoy-1.40-mesh", "refused"): ({NEXT}, {("upstream-refused", "error")},
                                     {("upstream-refused", "error", "server")}),
    ("envoy-1.40-mesh", "framing"): ({NEXT}, {("http-framing", "error")}, {("http-framing", "error", "server")}),
    ("envoy-1.40-mesh", "stale-keepalive"): ({NEXT}, {("stale-keepalive", "error")},
                                             {("stale-keepalive", "error", "server")}),
    ("envoy-1.40-mesh", "goaway"): ({NEXT}, {("upstream-goaway", "error")}, {("upstream-goaway", "error", "server")}),
    # the caller's route timeout (504 UT) is the server's 0 DC; the caller's own clients giving up are DC at both
    ("envoy-1.40-mesh", "slow-app"): ({("upstream-timeout", "error"), ("downstream-disconnect", "warning")},
                                      {("downstream-disconnect", "warning")},
                                      {("upstream-timeout", "error", "caller"),
                                       ("downstream-disconnect", "warning", "caller")}),
    # the pod's sidecar closed an idle mTLS connection the caller's pool then reused: 503 UC at the caller; the
    # server's eth0 shows it too (close_notify, then RST with the request unread), and both captures of that one
    # connection are one finding, the caller's, which quotes its 503 UC
    ("envoy-1.40-mesh", "downstream-idle"): ({("stale-keepalive", "error")}, {("stale-keepalive", "error")},
                                             {("stale-keepalive", "error", "caller")}),
    # the caller's sidecar answers 426/403/400 itself: the server never sees those requests
    ("envoy-1.40-mesh", "http10"): ({("downstream-protocol-error", "error")}, set(),
                                    {("downstream-protocol-error", "error", "caller")}),
    # the DestinationRule and VirtualService are the caller's: it answers 503 UO, 503 UH, 404 NR itself, and the
    # pod's sidecar never sees those requests (its log holds only the requests that passed)
    ("envoy-1.40-mesh", "overflow"): ({("circuit-breaker-overflow", "error")}, set(),
                                      {("circuit-breaker-overflow", "error", "caller")}),
    ("envoy-1.40-mesh", "outlier"): ({("no-healthy-upstream", "error")}, set(),
                                     {("no-healthy-upstream", "error", "caller")}),
    ("envoy-1.40-mesh", "no-route"): ({("no-route", "warning")}, set(), {("no-route", "warning", "caller")}),
    # a caller told tls DISABLE at a STRICT pod: its plaintext connection reset unread (both ends' eth0 show it),
    # the caller's 503 UC for the request it had written, the pod's listener's NR filter_chain_not_found
    ("envoy-1.40-mesh", "mtls-strict"): ({("tls-mismatch", "error")}, {("tls-mismatch", "error")},
                                         {("tls-mismatch", "error", "server")}),
    # the caller's mTLS to a pod without a sidecar: 503 URX,UF TLS_error WRONG_VERSION_NUMBER; the pod has captures
    # only, and its eth0 shows each ClientHello answered in plaintext
    ("envoy-1.40-mesh", "tls-to-plaintext"): ({("tls-mismatch", "error")}, {("tls-mismatch", "error")},
                                              {("tls-mismatch", "error", "caller")}),
    # the pod's sidecar ran out of source ports to the app (EADDRNOTAVAIL, 503 UF); the caller relays its 503s
    ("envoy-1.40-mesh", "port-exhaustion"): ({NEXT}, {("source-port-exhaustion", "error")},
                                             {("source-port-exhaustion", "error", "server")}),
    # the app bound to 127.0.0.1: the pod's sidecar dials the pod IP and is refused, as for refused
    ("envoy-1.40-mesh", "refused-localhost"): ({NEXT}, {("upstream-refused", "error")},
                                               {("upstream-refused", "error", "server")}),
    # the pod drops the first SYNs to its TCP port: the caller's sidecar retransmits them (both eth0 captures hold
    # the same frames), and its TCP proxy's connection is made 2.5 s late
    ("envoy-1.40-mesh", "syn-drop"): ({("syn-timeout", "error")}, {("syn-timeout", "error")},
                                      {("syn-timeout", "error", "caller")}),
    # an out-of-window segment of the caller's upload is INVALID to the pod's conntrack, skips the REDIRECT and is
    # reset by the app's port: both eth0 captures hold that RST; read together it is the caller's finding, which
    # quotes its 503 UC
    ("envoy-1.40-mesh", "conntrack-invalid"): ({("conntrack-invalid", "error")}, {("conntrack-invalid", "error")},
                                               {("conntrack-invalid", "error", "caller")}),
    # a server-first app behind a port the caller's sidecar sniffs: the caller's lo shows its connections silent
    # until the client gives up, its sniffing listener counts downstream_listener_filter_remote_close; nothing
    # reaches the server pod
    ("envoy-1.40-mesh", "server-first"): ({("server-first-protocol", "error")}, set(),
                                          {("server-first-protocol", "error", "caller")}),
    # the app reconnects from the source port of a connection its caller sidecar still holds half-closed on
    # 127.0.0.1:15001: the old connection's ACK answers its SYN on the caller's lo, the app's RST clears it and the
    # resent SYN is served (a warning: nothing failed, a connect was late); nothing of it reaches the server
    ("envoy-1.40-mesh", "outbound-stale"): ({("tuple-collision", "warning")}, set(),
                                            {("tuple-collision", "warning", "caller")}),
    # the healthy mesh: PERMISSIVE and STRICT, HTTP/1.1 and h2 between the sidecars, requests kept alive, short
    # ones that ask `Connection: close`, and no keep-alive on any hop (healthy-short): nothing but the spec's lint
    ("envoy-1.40-mesh", "healthy-http"): (set(), set(), set()),
    ("envoy-1.40-mesh", "healthy"): (set(), set(), set()),
    ("envoy-1.40-mesh", "healthy-h2"): (set(), set(), set()),
    ("envoy-1.40-mesh", "healthy-strict"): (set(), set(), set()),
    ("envoy-1.40-mesh", "healthy-strict-h2"): (set(), set(), set()),
    ("envoy-1.40-mesh", "healthy-short"): (set(), set(), set()),
    ("envoy-1.40-mesh-retry503", "refused"): ({NEXT}, {("upstream-refused", "error")},
                                              {("upstream-refused", "error", "server")}),
    # the retry answered: the user saw 200, the server logged the UC; the caller's counters say retries hid it
    ("envoy-1.40-mesh-retry503", "stale-keepalive"): ({("next-hop", "warning")}, {("stale-keepalive", "error")},
                                                      {("stale-keepalive", "error", "server"),
                                                       ("next-hop", "warning", "caller")}),
}
# What the product does not yet do with a recording, read together (each a strict xfail: it fails today)
NOT_YET_BOTH: dict = {}
NOT_YET_ALONE: dict = {}

# The leg of the request's path each finding of both pods read together is on (core/hop_path.py), by case and
# detector: client -> caller sidecar (the caller pod's lo), caller sidecar -> server sidecar (eth0, mTLS), server
# sidecar -> app (the server pod's lo).
CLIENT, BETWEEN, APP = "client -> caller sidecar", "caller sidecar -> server sidecar", "server sidecar -> app"
HOP_LEGS = {
    "refused": {"upstream-refused": {APP}},
    "refused-localhost": {"upstream-refused": {APP}},
    "framing": {"http-framing": {APP}},
    "stale-keepalive": {"stale-keepalive": {APP}},
    "goaway": {"upstream-goaway": {APP}},
    "port-exhaustion": {"source-port-exhaustion": {APP}},
    "slow-app": {"upstream-timeout": {BETWEEN}, "downstream-disconnect": {CLIENT}},
    "downstream-idle": {"stale-keepalive": {BETWEEN}},
    # a codec's refusal names no cluster: the sidecar's downstream, the pod's place not told by that line
    "http10": {"downstream-protocol-error": {CLIENT, "client -> sidecar"}},
    "overflow": {"circuit-breaker-overflow": {BETWEEN}},
    "outlier": {"no-healthy-upstream": {BETWEEN}},
    "no-route": {"no-route": {CLIENT}},
    "mtls-strict": {"tls-mismatch": {BETWEEN}, "access-log": {BETWEEN}},
    "tls-to-plaintext": {"tls-mismatch": {BETWEEN}},
    "syn-drop": {"syn-timeout": {BETWEEN}},
}
