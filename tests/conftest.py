import os
import shutil

import pytest

_LAB_TOOLS = ("ip", "iptables", "conntrack", "tcpdump", "tshark", "nstat")
LAB_FILE_CAP = 12


def pytest_addoption(parser):
    parser.addoption("--lab-shard", default="", metavar="K/N",
                     help="run only the K-th of N shares of the lab test files (scripts/test runs N pytests at once: "
                          "the lab tests mostly wait on timers and real Envoy, so they overlap well)")


def _lab_shard(config, items):
    """Keep the lab tests of the K-th of N shares of the lab test files (whole files, so that a file's
    module-scoped lab stays in one share); other tests are untouched. Raises pytest.UsageError on a bad K/N."""
    text = config.getoption("--lab-shard")
    if not text:
        return items
    try:
        k, n = (int(x) for x in text.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--lab-shard {text!r}: K/N with 1 <= K <= N") from None
    count: dict = {}
    for item in items:
        if "lab" in item.keywords:
            count[item.path] = count.get(item.path, 0) + 1
    # A file's weight: its tests, at most LAB_FILE_CAP (a test is mostly one watch or one round, but a file of
    # many parametrized checks shares one lab and runs them in seconds). The heaviest first, each to the lightest
    # share so far; ties by name, so every share agrees.
    weight = {p: min(c, LAB_FILE_CAP) for p, c in count.items()}
    shares: list[list] = [[] for _ in range(n)]
    for path in sorted(weight, key=lambda p: (-weight[p], str(p))):
        min(shares, key=lambda share: (sum(weight[p] for p in share), shares.index(share))).append(path)
    mine = set(shares[k - 1])
    keep = [item for item in items if "lab" not in item.keywords or item.path in mine]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    return keep


def pytest_collection_modifyitems(config, items):
    """Lab tests need root and the lab's tools; elsewhere they are skipped with the reason, never silently. With
    --lab-shard, only this share of the lab test files is run."""
    items[:] = _lab_shard(config, items)
    missing = [t for t in _LAB_TOOLS if shutil.which(t) is None]
    reason = None
    if os.geteuid() != 0:
        reason = "lab tests need root (network namespaces, iptables): run scripts/test with sudo"
    elif missing:
        reason = f"lab tests need {', '.join(missing)}: run scripts/install"
    if reason:
        for item in items:
            if "lab" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
