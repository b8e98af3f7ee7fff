"""sources/pyshark_adapter.py is our only way into pyshark's internals: each private name it overrides, calls or
reads must still be there, taking the same parameters, and the version installed must be the one pyproject.toml
pins. A pyshark release that moves one fails here, by name, before it fails a capture."""

from __future__ import annotations

import asyncio
import fcntl
import importlib
import inspect
import os
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from kubectl_meshdoctor.sources.pyshark_adapter import (
    POLLED_PIPE_BYTES,
    PYSHARK_ATTRIBUTES,
    PYSHARK_INTERNALS,
    FieldsPipeCapture,
    PolledPipe,
)
from kubectl_meshdoctor.sources.tshark import FIELD_ARGS, FIELDS

ROOT = Path(__file__).resolve().parent.parent.parent
CAPTURE = ROOT / "tests" / "data" / "lab-collision-eth0.pcap"


def _class(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_pinned_pyshark_is_installed():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in dependencies if d.startswith("pyshark")]
    assert pin == f"pyshark=={version('pyshark')}"


@pytest.mark.parametrize("dotted, name", [(c, n) for c, names in PYSHARK_INTERNALS.items() for n in names])
def test_each_internal_the_adapter_uses_is_there_with_its_parameters(dotted, name):
    member = getattr(_class(dotted), name, None)
    assert callable(member), f"{dotted}.{name} is gone"
    assert tuple(inspect.signature(member).parameters) == PYSHARK_INTERNALS[dotted][name]


def test_the_attributes_the_adapter_reads_are_set_by_pyshark():
    async def made() -> list[str]:  # as the product makes one: inside a running loop, given that loop
        fd = os.open(CAPTURE, os.O_RDONLY)
        try:
            capture = FieldsPipeCapture(fd, output_args=FIELD_ARGS, eventloop=asyncio.get_running_loop())
            return [a for a in PYSHARK_ATTRIBUTES if not hasattr(capture, a)]
        finally:
            os.close(fd)

    assert asyncio.run(made()) == []


def test_the_adapter_hands_over_tsharks_lines_in_batches():
    """Through pyshark for real: tshark's -T fields lines of a recorded capture, whole, in FIELDS' order."""
    lines: list[str] = []

    async def read() -> int | None:
        fd = os.open(CAPTURE, os.O_RDONLY)
        capture = FieldsPipeCapture(fd, output_args=FIELD_ARGS, eventloop=asyncio.get_running_loop())
        try:
            await capture.packets_from_tshark(lambda batch: lines.extend(batch.decode().split("\n")),
                                              close_tshark=True)
        finally:
            os.close(fd)
        return capture.exit_status

    status = asyncio.run(read())
    rows = [line.split("\t") for line in lines if line]
    assert status == 0 and len(rows) >= 20
    assert all(len(r) == len(FIELDS) for r in rows)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1))  # frame numbers, none lost or cut


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_polled_output_hands_over_the_same_lines_and_closes_its_pipe():
    """A live dissection's tshark writes a line a packet (-l) into a pipe read by polling (PolledPipe): the lines
    are those of pyshark's own reader, and the pipe is gone once tshark is."""

    async def read(**kwargs) -> list[bytes]:
        batches: list[bytes] = []
        fd = os.open(CAPTURE, os.O_RDONLY)
        capture = FieldsPipeCapture(fd, output_args=FIELD_ARGS, eventloop=asyncio.get_running_loop(), **kwargs)
        try:
            await capture.packets_from_tshark(batches.append, close_tshark=True)
        finally:
            os.close(fd)
        assert capture.exit_status == 0
        return b"\n".join(batches).split(b"\n")

    plain = asyncio.run(read())
    before = _open_fds()
    polled = asyncio.run(read(line_buffered=True, poll_s=0.01))
    assert len(plain) >= 20 and polled == plain
    assert _open_fds() <= before


def test_a_polled_pipe_gives_what_comes_after_it_began_waiting_then_end_of_file():
    async def run() -> tuple[bytes, bytes, bytes]:
        read_fd, write_fd = os.pipe()
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, POLLED_PIPE_BYTES)  # a smaller pipe is not polled (read as it comes)
        pipe = PolledPipe(read_fd, 0.005)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, os.write, write_fd, b"1\tline\n")
        first = await asyncio.wait_for(pipe.read(1 << 15), 5)
        os.write(write_fd, b"2\tmore\n")
        os.close(write_fd)
        second = await asyncio.wait_for(pipe.read(1 << 15), 5)
        end = await asyncio.wait_for(pipe.read(1 << 15), 5)
        again = await pipe.read(1 << 15)  # closed: end of file again, no error
        assert again == b""
        return first, second, end

    before = _open_fds()
    assert asyncio.run(run()) == (b"1\tline\n", b"2\tmore\n", b"")
    assert _open_fds() <= before
