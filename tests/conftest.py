import os
import shutil

import pytest

_LAB_TOOLS = ("ip", "iptables", "conntrack", "tcpdump", "tshark", "nstat")


def pytest_collection_modifyitems(config, items):
    """Lab tests need root and the lab's tools; elsewhere they are skipped with the reason, never silently."""
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
