"""bench/profile.py's reading of py-spy's raw output (collapsed stacks): samples add up per function, own and
inclusive, and the inclusive list keeps our code and pyshark's. Not timed; no profiler runs here."""

from __future__ import annotations

from tests.bench.test_gen import _load

profile = _load("profile")


def test_samples_add_up_per_function_over_lines_and_processes(tmp_path):
    raw = tmp_path / "spy.raw"
    raw.write_text(
        "process 10:\"python x\";<module> (kubectl-meshdoctor:8);feed (kubectl_meshdoctor/core/pipeline.py:159);"
        "observe (kubectl_meshdoctor/core/flows.py:103) 6\n"
        "process 10:\"python x\";<module> (kubectl-meshdoctor:8);feed (kubectl_meshdoctor/core/pipeline.py:160) 3\n"
        "process 10:\"python x\";_run (/usr/lib/python3.11/asyncio/events.py:80) 1\n")
    total, own, inclusive = profile.top_functions(raw, 10)
    assert total == 10
    assert own == [("observe (kubectl_meshdoctor/core/flows.py)", 6), ("feed (kubectl_meshdoctor/core/pipeline.py)", 3),
                   ("_run (asyncio/events.py)", 1)]
    assert dict(inclusive) == {"feed (kubectl_meshdoctor/core/pipeline.py)": 9,
                               "observe (kubectl_meshdoctor/core/flows.py)": 6}
