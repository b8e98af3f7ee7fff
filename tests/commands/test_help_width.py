"""Every command's --help fits an 80-column terminal (COLUMNS=80): prose re-wrapped, examples kept as written
(commands/help_format.py). The commands are found through the CLI's own parser, the lab's (an entry point of
another distribution) among them."""

from __future__ import annotations

import argparse

import pytest

from kubectl_meshdoctor.cli import build_parser
from kubectl_meshdoctor.commands.help_format import fill


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for ``parser`` and every subcommand under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_help_fits_80_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    found = dict(_parsers(build_parser()))
    # The commands a user meets: the product's and the lab's, with its actions.
    assert {(), ("watch",), ("analyze",), ("lint",), ("log-level",), ("lab",), ("lab", "up")} <= set(found)
    long = [(" ".join(words) or "(top)", line) for words, p in found.items()
            for line in p.format_help().splitlines() if len(line) > 80]
    assert long == [], "\n".join(f"{w}: {len(line)}: {line}" for w, line in long)


def test_prose_is_rewrapped_and_examples_kept():
    text = (("word " * 40).strip() + "\nsecond line of the same paragraph\n\nexamples:\n"
            "  kubectl meshdoctor analyze a.pcap   # a short one\n"
            "  kubectl meshdoctor analyze lo.pcap eth0.pcap --tui    # browse findings, ladder diagrams and packets\n"
            "  http10             caller-http11, accept-http10, caller-no-upgrade, caller-valid-request\n")
    out = fill(text, 60).splitlines()
    assert all(len(line) <= 60 for line in out), out
    assert out[out.index("examples:") + 1] == "  kubectl meshdoctor analyze a.pcap   # a short one"
    i = out.index("  # browse findings, ladder diagrams and packets")
    assert out[i + 1] == "  kubectl meshdoctor analyze lo.pcap eth0.pcap --tui"
    row = [line for line in out if "http10" in line or line.startswith(" " * 21)]
    assert row[0].startswith("  http10             caller-http11") and row[1].startswith(" " * 21 + "caller-")
    assert "second line of the same paragraph" in " ".join(out[:4])  # one paragraph, not two


@pytest.mark.parametrize("width", [120, 200])
def test_a_wide_terminal_keeps_comments_beside_their_commands(monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    text = build_parser()._subparsers._group_actions[0].choices["analyze"].format_help()
    assert "kubectl meshdoctor analyze lo.pcap eth0.pcap --tui    # browse findings" in text
