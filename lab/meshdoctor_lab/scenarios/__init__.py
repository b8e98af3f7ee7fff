"""Scenario drivers: downstream clients that reproduce a failure (or its absence) against a lab pod.

Run in the pod's CLIENT namespace. Each round is self-contained (opens and closes its own sockets); the driver
loop is bounded by a round count AND a time limit. One JSON line per round goes to stdout.

    ip netns exec <client-ns> python -m meshdoctor_lab.scenarios collision \\
        --pod-ip 198.18.1.2 --client-ip 198.18.1.1 --pod-netns mdlab-collision --rounds 1

Scenarios:
  collision  client_ip:X holds a live HTTP keep-alive to pod:5000; conntrack is flushed in the pod namespace;
             a second socket bound to the same client_ip:X dials pod:5002. REDIRECT maps both to
             pod:15006, so the SYN lands on the live four-tuple: the pod answers with an RFC 5961 challenge
             ACK, the client resets (which kills the live connection), and the retransmitted SYN succeeds.
  remap      the same port reuse without the flush: conntrack still knows the live connection, so NAT
             remaps the source port of the second one. Exposure, no failure, no challenge ACK.
  healthy    HTTP GETs on new connections (kernel-chosen ports) and TCP echo exchanges. No errors.
  healthy-http
             negative cases for the HTTP detectors: a Content-Length response and a valid chunked one on one
             keep-alive, `/close` (the app answers `Connection: close` and FINs; no request follows on that
             upstream connection), then 20 short connections. 200s only, no RST on lo.
  framing    one GET per FRAMING_VARIANTS path, each on a new connection; the app answers with broken framing,
             Envoy's HTTP/1 codec rejects it, closes the upstream connection (FIN from 127.0.0.6: it has read the
             response) and answers 502 UPE.
  stale-keepalive
             GET 1 leaves a pooled upstream connection; the app's idle timer fires STALE_IDLE_TIMEOUT later and
             its close() comes STALE_CLOSE_DELAY after that. GET 2, on a new downstream connection, is sent in
             that window: Envoy, which has seen no FIN, writes it on the pooled connection, the app never reads
             it, and its close() with unread data is an RST (no FIN at all). The client gets 503 UC.
  refused    nothing listens on :5000: the sidecar's SYN from 127.0.0.6 gets RST, the client gets 503 UF.
  refused-localhost
             the app listens on 127.0.0.1:5000 only; the sidecar dials pod_ip:5000: same RST, same 503 UF.
  syn-drop   the pod drops SYNs to :5002 (raw PREROUTING) for SYN_DROP_SECONDS (2.5 s) while the client
             connects: the client kernel retransmits the same SYN (same seq) after ~1 s (and ~2 s on kernels with
             linear SYN timeouts); the retransmit at ~3 s passes, so the connect succeeds after ~3 s (it never
             times out) and the echo works.
  load       steady keep-alive GETs for LOAD_ROUND_SECONDS at LOAD_ROUND_PPS packets/s on the pod's lo + eth0
             (run_load; bench/live drives it at its own rate): a share through the sidecar (client -> :5000), the
             rest straight to the app, on eth0 to :15020 (istio-iptables excludes it from REDIRECT) and on lo
             from 127.0.0.6 (the sidecar's upstream leg, without Envoy's CPU per request). The app
             is a canned responder (apps http --fast). 200s only; no RST, no detector finding.
  overflow   a connectionPool of one connection and one pending request: a slow request holds the connection, a
             second queues (waited for on the pod's admin port), a third gets 503 UO {overflow}, never dialled.
  outlier    five GETs of /status/500 (the app's 500s) eject the only endpoint of an outlierDetection that may eject
             all of them, with panic routing off; the next requests get 503 UH no_healthy_upstream. A round first
             waits (bounded) for a former round's ejection to end.
  no-route   /v1/ok matches the VirtualService's /v1 prefix, /other no route: 404 NR route_not_found.
  mtls-strict
             a plaintext GET at the STRICT port (reset: 0 NR filter_chain_not_found), then an mTLS GET with the
             lab CA's certificate and Istio's ALPN (served).
  tls-to-plaintext
             one GET; the sidecar's ISTIO_MUTUAL ClientHello meets the plaintext app: 503 UF TLS_error.
  healthy-strict, healthy-strict-h2, healthy-short
             the healthy mesh (healthy_rounds.py): five GETs kept alive on one connection, five that each ask
             `Connection: close`, two TCP echoes. A STRICT pod (-h2: HTTP/2 from its sidecar on, and between
             sidecars through a caller sidecar) is called in mTLS; healthy-short's DestinationRule
             maxRequestsPerConnection 1 makes every request a connection of its own on every hop. 200s only.
"""

from .driver import DEFAULT_PERIOD, DEFAULT_ROUNDS, DEFAULT_SECONDS, challenge_ack_count, drive, run_round
from .http_rounds import HEALTHY_SHORT_CONNECTIONS
from .load import (
    LOAD_DEFAULT_CONNECTIONS,
    LOAD_DIRECT_PORT,
    LOAD_MAX_CONNECTIONS,
    LOAD_MAX_PPS,
    LOAD_MAX_SECONDS,
    LOAD_PATHS,
    LOAD_REQUEST,
    LOAD_ROUND_PPS,
    LOAD_ROUND_SECONDS,
    LoadResult,
    run_load,
)
from .port_reuse import flush_conntrack
from .rounds import RoundResult
from .table import SCENARIOS, SETUPS, STALE_CLOSE_DELAY, STALE_IDLE_TIMEOUT, STALE_REUSE_AFTER, PodSetup
from .tcp_rounds import SYN_DROP_SECONDS

__all__ = [
    "DEFAULT_PERIOD", "DEFAULT_ROUNDS", "DEFAULT_SECONDS", "HEALTHY_SHORT_CONNECTIONS", "LOAD_DEFAULT_CONNECTIONS",
    "LOAD_DIRECT_PORT", "LOAD_MAX_CONNECTIONS", "LOAD_MAX_PPS", "LOAD_MAX_SECONDS", "LOAD_PATHS", "LOAD_REQUEST",
    "LOAD_ROUND_PPS", "LOAD_ROUND_SECONDS", "SCENARIOS", "SETUPS", "STALE_CLOSE_DELAY", "STALE_IDLE_TIMEOUT",
    "STALE_REUSE_AFTER", "SYN_DROP_SECONDS", "LoadResult", "PodSetup", "RoundResult", "challenge_ack_count",
    "drive", "flush_conntrack", "run_load", "run_round",
]
