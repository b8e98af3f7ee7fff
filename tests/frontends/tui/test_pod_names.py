"""A pod's short name on the rows and panes of a watch over several pods (frontends/tui/pod_names.py)."""

from __future__ import annotations

from kubectl_meshdoctor.frontends.tui.pod_names import MAX_LABEL, short_names


def test_a_deployments_pods_are_named_by_what_tells_them_apart():
    assert short_names(["reviews-v1-7d9f4-abcde", "reviews-v1-7d9f4-xyz12"]) == {
        "reviews-v1-7d9f4-abcde": "abcde", "reviews-v1-7d9f4-xyz12": "xyz12"}
    # a common part is left out only whole, and only where every name goes on after it
    assert short_names(["refused", "refused-caller"]) == {"refused": "refused", "refused-caller": "refused-caller"}
    assert short_names(["web-1", "web-12"]) == {"web-1": "1", "web-12": "12"}
    assert short_names(["api.v2_a", "api.v2_b"]) == {"api.v2_a": "a", "api.v2_b": "b"}


def test_one_pod_keeps_its_name_cut_and_long_names_are_cut_apart():
    assert short_names(["reviews-v1-7d9f4-abcde"]) == {"reviews-v1-7d9f4-abcde": "…iews-v1-7d9f4-abcde"}
    long = ["x-a" + "c" * 40, "x-b" + "c" * 40]  # the same end: cut keeping their starts
    names = short_names(long)
    assert names == {long[0]: "a" + "c" * (MAX_LABEL - 2) + "…", long[1]: "b" + "c" * (MAX_LABEL - 2) + "…"}
    ends = short_names(["x-" + "a" * 40 + "-one", "x-" + "a" * 40 + "-two"])
    assert sorted(ends.values()) == ["one", "two"]  # their long common part left out whole


def test_control_bytes_in_a_name_are_escaped():
    names = short_names(["p-\x1b[2Jx", "p-\u202ey"])
    assert names == {"p-\x1b[2Jx": "\\x1b[2Jx", "p-\u202ey": "\\u202ey"}


def test_names_cut_narrower_stay_apart_or_stay_whole():
    """The packets pane cuts the names further at 80 columns (packets_table.py): still told apart, else whole."""
    assert short_names(["downstream-idle-caller", "downstream-idle"], 7) == {
        "downstream-idle-caller": "…caller", "downstream-idle": "idle"}
    same_end = ["a-" + "x" * 30 + "1" + "y" * 9, "a-" + "x" * 30 + "2" + "y" * 9]  # apart only in their middle
    assert short_names(same_end, 8) == {p: p[2:] for p in same_end}
