"""Names for the labs tests start: MESHDOCTOR_TEST_LAB_PREFIX (default ``mdtest-``), a tag, random hex.

Several people (and agents) run lab tests on one machine; a prefix of their own names their labs, and a name of
at most 12 letters and digits (``mesh31j1a2b``) is also its network namespaces' prefix (netns.netns_prefix), so
`ip netns list` shows whose namespaces are whose.
"""

from __future__ import annotations

import os
import secrets

PREFIX_ENV = "MESHDOCTOR_TEST_LAB_PREFIX"


def lab_name(tag: str = "", hex_digits: int = 4) -> str:
    """A new lab name: the prefix, ``tag`` and ``hex_digits`` random hex digits."""
    prefix = os.environ.get(PREFIX_ENV, "mdtest-")
    return f"{prefix}{tag}{secrets.token_hex((hex_digits + 1) // 2)[:hex_digits]}"
