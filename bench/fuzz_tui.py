"""bench/fuzz --tui N: the triage desk over hostile text, N cases in this process (issue 29).

Each case builds, from a seeded random source, findings, packets, access-log entries, a /clusters dump and the
sidecar's logger names whose every text field is a random byte string (read as Latin-1, so C0, DEL and C1 all
occur) or one of bench/fuzz_mutate.py's HOSTILE pieces (ESC sequences, Rich markup such as `[/]` and
`[@click=app.quit]`, bidi overrides, NUL), some of them 100,000 characters long. Access-log entries and the
/clusters dump go through the product's own parsers (Istio's JSON access log, /clusters?format=json); findings
through core.redact.redact_finding, as the pipeline hands them out. Secrets are planted where the product
promises to hide them: a credential query parameter in titles, targets and quoted log lines, a header dump's
`'authorization', '...'`, a JSON access log's credential keys, credential headers of a packet.

The app is driven with Textual's pilot at 80x24 and 160x45 (alternately) over every pane: the findings list
with each row's detail and packets, help `?`, access log `a` (each row), clusters `c`, loggers `l`, instance
keys `[` `]`, then `q`; the report it returns is rendered as text, markdown and JSON. Counted bad: an exception,
the app not running after a pane, no report, a control byte (bench/fuzz_mutate.CONTROL) on screen or in the text or
markdown report, a planted secret's marker on screen or in any report.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import traceback
from pathlib import Path

from fuzz_mutate import CONTROL, HOSTILE

ROOT = Path(__file__).resolve().parent.parent


def hostile(rnd: random.Random) -> str:
    """Text from the traffic at its worst: 1-4 pieces of hostile bytes, random bytes or plain words."""
    parts = []
    for _ in range(rnd.randint(1, 4)):
        roll = rnd.random()
        if roll < 0.4:
            piece = rnd.choice(HOSTILE)
        elif roll < 0.7:
            piece = rnd.randbytes(rnd.randint(1, 40))
        elif roll < 0.97:
            piece = rnd.choice((b"inbound|5000||", b"GET /x", b"reviews-v1", b"10.244.1.23:5000", b"-", b""))
        else:
            piece = bytes([rnd.randrange(256)]) * 100_000
        parts.append(piece.decode("latin-1") if rnd.random() < 0.6 else piece.decode("utf-8", "replace"))
    return "".join(parts)


def screen_output(app) -> str:
    """What the compositor writes for the whole screen: what a terminal would be sent (tests/frontends/tui)."""
    update = app.screen._compositor.render_update(full=True)
    return "".join(seg.text for strip in update.strips for seg in strip)


def build(case: int, rnd: random.Random):
    """(session, markers) of one case."""
    from kubectl_meshdoctor.core.events import EnvoyCountersEvent, HttpStart, PacketEvent, TcpFlags
    from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
    from kubectl_meshdoctor.core.pipeline import Pipeline
    from kubectl_meshdoctor.core.redact import redact_finding
    from kubectl_meshdoctor.envoy.access_log import parse_line
    from kubectl_meshdoctor.envoy.clusters import parse_clusters
    from kubectl_meshdoctor.core.report_model import FilesSource, Report
    from kubectl_meshdoctor.frontends.tui.session import COUNTERS, SIDECAR_PANES, Session, SessionHooks

    markers: list[str] = []

    def secret() -> str:
        markers.append(f"Zq{case:06d}Tk{len(markers)}Qz")
        return markers[-1]

    h = lambda: hostile(rnd)  # noqa: E731
    now = time.time()
    findings = []
    for _ in range(rnd.randint(1, 5)):
        evidence = tuple(Evidence(h(), h(), rnd.randrange(1 << 20), rnd.choice((now, 0.0, 1e12, now - 86400)),
                                  f"{h()} GET /cb?access_token={secret()} {h()}", h(), h(), h(), rnd.randrange(9000),
                                  rnd.choice(("packet", "access-log", "envoy-log", "counter", "spec")))
                         for _ in range(rnd.randint(1, 4)))
        f = Finding(detector=rnd.choice(("stale-keepalive", "http-framing", h())), severity=rnd.choice(list(Severity)),
                    title=f"{h()} /login?token={secret()}", flow=FlowRef(h(), h(), h()), evidence=evidence,
                    envoy_flags=(rnd.choice(("UC", "UF", h())),), response_code_details=h(), explanation=h(),
                    remediation=h(), pod=h(), ts=now, details={h(): h(), "path": f"/x?code={secret()}"}, variant=h(),
                    access_log=(f'[2026-12-03T13:40:07.412Z] "GET /x?access_token={secret()} HTTP/1.1" 503 UC {h()}',),
                    envoy_log=(h(), f"'authorization', 'Bearer {secret()}'", f"'cookie', '{secret()}'"))
        findings.append(redact_finding(f))
    entries = []
    for _ in range(rnd.randint(1, 8)):
        doc = {"start_time": "2026-12-03T13:40:07.412Z", "method": h(), "path": f"{h()}?access_token={secret()}",
               "protocol": "HTTP/1.1", "response_code": rnd.choice((503, 502, 0, 200)),
               "response_flags": rnd.choice(("UC", "UF,URX", "-", h())), "response_code_details": h(),
               "duration": rnd.randrange(100), "bytes_sent": 0, "bytes_received": 0, "upstream_host": h(),
               "upstream_cluster": h(), "user_agent": h(), "authority": h(), "downstream_remote_address": h(),
               "authorization": f"Bearer {secret()}", "cookie": f"sid={secret()}", "x-api-key": secret()}
        e = parse_line(json.dumps(doc))
        if e is not None:
            entries.append(e)
    body = json.loads((ROOT / "tests" / "envoy" / "data" / "clusters.json").read_text())
    for c in body["cluster_statuses"]:
        c["name"] = h()
        for host in c.get("host_statuses", []):
            host["hostname"] = h()
            if "socket_address" in host.get("address", {}):
                host["address"]["socket_address"]["address"] = h()
    try:
        clusters = parse_clusters(json.dumps(body))
    except ValueError:
        clusters = {}
    packets = [PacketEvent(now, h(), h(), i, h(), rnd.randrange(65536), h(), rnd.randrange(65536),
                           TcpFlags(rnd.randrange(256)), rnd.getrandbits(32), rnd.getrandbits(32), rnd.randrange(9000),
                           HttpStart(f"GET /p?token={secret()} {h()}", ((h(), h()), ("Authorization", f"Bearer {secret()}"),
                                                                        ("Cookie", secret())), (h(),), True, ("",)))
               for i in range(rnd.randint(1, 6))]
    names = {h(): rnd.choice(("debug", "info", "warning", h())) for _ in range(rnd.randint(1, 12))}
    counters = EnvoyCountersEvent(now, {}, {f"cluster.{h()}.{h()}": rnd.randrange(1 << 40) for _ in range(8)},
                                  rnd.choice(("the first dump", "Envoy's start", "the run")), None, h())

    class Loggers:
        pod = h()

        def levels(self) -> dict[str, str]:
            return dict(names)

        def apply(self, spec: str) -> dict[str, str]:
            return dict(names)

    class HostileSession(Session):
        describe = h()

        def __init__(self) -> None:
            self.pipeline = Pipeline.with_detectors()

        async def run(self, hooks: SessionHooks):
            for f in findings:
                hooks.on_finding(f)
            await hooks.stop.wait()
            return Report(FilesSource((h(),), {}), self.pipeline.stats, list(findings))

        def stats(self):
            return self.pipeline.stats

        def pod(self):
            return h()

        def clusters(self, pod=None):
            return lambda: clusters

        def loggers(self, pod=None):
            return Loggers()

        def panes(self):
            return SIDECAR_PANES | {COUNTERS}

        def counters(self, pod=None):
            return lambda: counters

        def access_log(self):
            return list(entries)

        def problems(self):
            return [h()]

        def packets(self):
            return packets

    return HostileSession(), markers


async def _drive(session, size, shown: list[tuple[str, str]], problems: list[str]):
    from textual.widgets import DataTable

    from kubectl_meshdoctor.frontends.tui.app import MeshDoctorApp

    app = MeshDoctorApp(session)

    async def wait_for(pilot, condition, seconds: float = 10.0) -> bool:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                return False
            await pilot.pause(0.05)
        return True

    async def up(pilot, where: str) -> None:
        await pilot.pause(0.05)
        shown.append((where, screen_output(app)))
        if not app.is_running:
            problems.append(f"app not running after {where}")

    async with app.run_test(size=size) as pilot:
        table = app.query_one("#findings", DataTable)
        if not await wait_for(pilot, lambda: table.row_count >= 1):
            problems.append("no finding listed")
        for row in range(table.row_count):
            table.move_cursor(row=row)
            await up(pilot, f"finding row {row}")
        for keys, pane in ((("right_square_bracket", "left_square_bracket"), "instance keys"),
                           (("question_mark",), "help"), (("escape",), "help closed")):
            await pilot.press(*keys)
            await up(pilot, pane)
        for key, widget in (("a", "#access-log"), ("c", "#clusters"), ("l", "#loggers"), ("k", "#counters")):
            await pilot.press(key)
            if not await wait_for(pilot, lambda: app.screen.query(widget)):
                problems.append(f"pane {widget} not shown")
                continue
            pane = app.screen.query_one(widget, DataTable)
            await wait_for(pilot, lambda: pane.row_count > 0, 3.0)
            await up(pilot, widget)
            for row in range(min(pane.row_count, 8)):
                pane.move_cursor(row=row)
                await up(pilot, f"{widget} row {row}")
            await pilot.press("escape")
            await up(pilot, f"{widget} closed")
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
    return app.return_value


def run_case(case: int, seed: int) -> dict:
    """One hostile case; what went wrong in it."""
    from kubectl_meshdoctor.frontends.report import RENDERERS

    started = time.monotonic()
    rnd = random.Random(seed * 1_000_003 + case)
    size = ((80, 24), (160, 45))[case % 2]
    shown: list[tuple[str, str]] = []
    problems: list[str] = []
    r = {"case": case, "size": f"{size[0]}x{size[1]}", "exception": None}
    session, markers = build(case, rnd)
    try:
        report = asyncio.run(_drive(session, size, shown, problems))
        if report is None:
            problems.append("no report")
        else:
            for fmt, render in RENDERERS.items():
                text = render(report)
                shown.append((f"report -o {fmt}", text)) if fmt != "json" else None
                r.setdefault("report_secrets", []).extend(m for m in markers if m in text)
    except Exception as e:  # counted, with where it came from
        r["exception"] = f"{type(e).__name__}: {str(e)[:200]} at " + " / ".join(
            f"{fr.filename.rsplit('/', 1)[-1]}:{fr.lineno}" for fr in traceback.extract_tb(e.__traceback__)[-3:])
    screen = "\n".join(text for _, text in shown)
    r["control_bytes"] = sorted({f"U+{ord(c):04X}" for c in CONTROL.findall(screen)})
    r["where"] = sorted({where for where, text in shown if CONTROL.search(text)
                         or any(m in text for m in markers)})
    r["secrets_shown"] = sorted({m for m in markers if m in screen} | set(r.pop("report_secrets", [])))
    r["seconds"] = round(time.monotonic() - started, 1)
    r["problems"] = problems
    return r


def run(count: int, seed: int, jobs: int = 1) -> dict:
    """N cases, ``jobs`` processes at once (each case starts its own app: Textual's rendering of the hostile
    text, not its start, takes most of a case's seconds); prints the counts, returns them with the bad cases."""
    from concurrent.futures import ProcessPoolExecutor

    started = time.monotonic()
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(run_case, range(count), [seed] * count))
    else:
        results = [run_case(n, seed) for n in range(count)]
    counts = {"cases": count, "exceptions": sum(bool(r["exception"]) for r in results),
              "app not running or no report": sum(bool(r["problems"]) for r in results),
              "control bytes on screen or in a report": sum(bool(r["control_bytes"]) for r in results),
              "secrets shown": sum(bool(r["secrets_shown"]) for r in results)}
    bad = [r for r in results if r["exception"] or r["problems"] or r["control_bytes"] or r["secrets_shown"]]
    print(f"bench/fuzz --tui seed {seed}: {count} cases in {time.monotonic() - started:.0f} s, {jobs} at once")
    for what, n in counts.items():
        print(f"  {what}: {n}")
    for r in bad:
        print(f"  tui case {r['case']}: {json.dumps(r)[:2000]}")
    return {"counts": counts, "bad": bad}
