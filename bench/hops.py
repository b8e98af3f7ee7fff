"""What joining one request's lines across pods costs (issue 31): ``bench/hops [--sizes 800,1600,3200,6400]``.

For each size N it builds N failing requests as two pods' sidecars log them (Istio's default TEXT access-log
format, as real Envoy 1.40 wrote it in tests/data/envoy-1.40-mesh): the caller's relayed ``503 - via_upstream``
on its outbound cluster (a next-hop finding) and the server's ``503 UF`` on its inbound cluster (an
upstream-refused finding), each request on a connection of its own, one a millisecond, over 20 caller pods; and
every tenth request a third pod behind the server (a chain: the server's app passes on the 503 of its call). Then
it times core.hops.join_hops over them (the median of --repeat runs), once with a fresh x-request-id a request
and once with one id for all of them (a client that sends a fixed id: the worst case for a join by id).

It prints, per size and id mode, the seconds and the ratio to the size before. A join that is near-linear doubles
its time when N doubles; a quadratic one quadruples it (6400 pairs took 15 s before issue 31). Exit 1 when a
ratio exceeds --max-ratio (default 3.0) at a size of 1600 or more, or when a request's lines were not joined into
one finding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

from kubectl_meshdoctor.core.findings import Finding, NoFlow, Severity
from kubectl_meshdoctor.core.hops import join_hops
from kubectl_meshdoctor.envoy.access_log import parse_line

T0 = 1764770498.0
SERVER = "10.244.9.9:5000"
NEXT = "10.244.7.7:8080"


def _line(ts: float, code: int, flags: str, details: str, rid: str, host: str, cluster: str, local: str,
          dlocal: str, dremote: str) -> str:
    """One line in Istio's default TEXT format (istio/istio pilot/pkg/model/telemetry_logging.go; the
    recordings' sidecars wrote it)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(round(ts * 1000)) % 1000:03d}Z"
    return (f'[{stamp}] "GET /orders HTTP/1.1" {code} {flags} {details} - "-" 0 95 3 - "-" "bench" "{rid}" '
            f'"orders:5000" "{host}" {cluster} {local} {dlocal} {dremote} - default')


def _finding(detector: str, pod: str, line: str) -> Finding:
    entry = parse_line(line)
    return Finding(detector, Severity.ERROR, detector, NoFlow("counter", "bench"), (), explanation=f"{detector}.",
                   pod=pod, ts=entry.ts, access_log=(line,), entries=(entry,))


def requests(n: int, fixed_id: bool) -> list[Finding]:
    """The findings of ``n`` failing requests, in time order (module docstring)."""
    out = []
    for k in range(n):
        ts = T0 + k * 0.001
        rid = "fixed-request-id" if fixed_id else str(uuid.UUID(int=k))
        caller = f"10.244.{1 + k % 20}.{10 + k % 200}"
        port = 20000 + k % 40000
        out.append(_finding("next-hop", f"caller-{k % 20}", _line(
            ts, 503, "-", "via_upstream", rid, SERVER, "outbound|5000||orders.shop.svc.cluster.local",
            f"{caller}:{port}", "10.96.14.2:5000", f"{caller}:40100")))
        if k % 10 == 0:  # the server's app relays the 503 of its own call, refused one pod on
            out.append(_finding("next-hop", "orders", _line(
                ts + 0.0004, 503, "-", "via_upstream", rid, NEXT, "outbound|8080||stock.shop.svc.cluster.local",
                f"10.244.9.9:{30000 + k % 30000}", "10.96.3.4:8080", "10.244.9.9:40200")))
            out.append(_finding("upstream-refused", "stock", _line(
                ts + 0.0006, 503, "UF", "upstream_reset_before_response_started{remote_connection_failure}", rid,
                NEXT, "inbound|8080||", "-", NEXT, f"10.244.9.9:{30000 + k % 30000}")))
            out.append(_finding("x", "orders", _line(  # the server's inbound line of it: its app's 503, passed on
                ts + 0.0002, 503, "-", "via_upstream", rid, SERVER, "inbound|5000||", "127.0.0.6:50000", SERVER,
                f"{caller}:{port}")))
        else:
            out.append(_finding("upstream-refused", "orders", _line(
                ts + 0.0002, 503, "UF", "upstream_reset_before_response_started{remote_connection_failure}", rid,
                SERVER, "inbound|5000||", "-", SERVER, f"{caller}:{port}")))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="800,1600,3200,6400", help="request counts, ascending")
    ap.add_argument("--repeat", type=int, default=3, help="runs a size, the median taken")
    ap.add_argument("--max-ratio", type=float, default=3.0, help="the largest time ratio when N doubles")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    failed = False
    for fixed_id in (False, True):
        before: float | None = None
        for n in sizes:
            findings = requests(n, fixed_id)
            times = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                joined = join_hops(findings)
                times.append(time.perf_counter() - started)
            took = statistics.median(times)
            whole = len(joined) == n and all(len(f.access_log) in (2, 4) for f in joined)
            ratio = took / before if before else None
            print(f"{'one id for all' if fixed_id else 'an id a request':16} N={n:6d} findings={len(findings):6d} "
                  f"join {took:7.3f} s" + (f"  x{ratio:.2f} of N/2" if ratio else "")
                  + ("" if whole else "  NOT JOINED: a request's lines are in several findings"))
            failed |= not whole or (ratio is not None and n >= 1600 and ratio > args.max_ratio)
            before = took
    print("FAIL" if failed else "PASS: near-linear, every request one finding")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
