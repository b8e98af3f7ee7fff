"""Names for the labs tests start: MESHDOCTOR_TEST_LAB_PREFIX (default ``mdtest-``), a tag, random hex.

Several people (and agents) run lab tests on one machine; a prefix of their own names their labs, and a name of
at most 12 letters and digits (``mesh31j1a2b``) is also its network namespaces' prefix (netns.netns_prefix), so
`ip netns list` shows whose namespaces are whose.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

PREFIX_ENV = "MESHDOCTOR_TEST_LAB_PREFIX"


def lab_name(tag: str = "", hex_digits: int = 4) -> str:
    """A new lab name: the prefix, ``tag`` and ``hex_digits`` random hex digits."""
    prefix = os.environ.get(PREFIX_ENV, "mdtest-")
    return f"{prefix}{tag}{secrets.token_hex((hex_digits + 1) // 2)[:hex_digits]}"


@contextmanager
def caller_sidecar_lab(tmp_path_factory, tag: str, scenarios: tuple[str, ...], fixes=None) -> Iterator:
    """A lab (named with ``tag``) of ``scenarios``, each pod called through a caller sidecar (`lab up --caller
    sidecar`), no drivers (the test triggers each round), ``fixes`` (pod -> LabFix) applied; down on the way
    out."""
    from meshdoctor_lab import lab

    name = lab_name(tag)
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, scenarios, drivers=False,
                   mesh=lab.MeshOptions(caller="sidecar"), fixes=fixes)
    try:
        yield state
    finally:
        lab.down(state.state_dir)
