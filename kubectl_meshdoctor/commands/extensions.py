"""Commands other distributions add to ``kubectl meshdoctor``, through the entry-point group
``kubectl_meshdoctor.commands``, as detectors come in through ``kubectl_meshdoctor.detectors``.

The entry point's name is the command's name; its object has ``help`` (one line for the command list),
``add_arguments(parser)`` (the command's flags and subcommands, on the parser the CLI made for it) and
``run(args) -> int`` (the exit code). The pod lab (lab/, the ``kubectl-meshdoctor-lab`` distribution) comes in
this way: the product imports nothing of it.

An extension that fails to load is not allowed to take the other commands down: its command stays listed and,
when run, says in one line why it cannot (exit 2).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol

GROUP = "kubectl_meshdoctor.commands"
# Where to get a command the product names in its own help but does not ship (README: how to install the lab).
KNOWN_ELSEWHERE = {"lab": "the pod lab is a distribution of its own: from the repository, pip install ./lab "
                          "(or run scripts/install)"}


class CommandExtension(Protocol):
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True, slots=True)
class Broken:
    """An extension that failed to load: ``why`` is the one line its command prints."""

    name: str
    why: str
    help: str = "(failed to load: run it to see why)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        from kubectl_meshdoctor.commands.console import error

        return error(self.why)


def load_extensions(builtin: frozenset[str]) -> dict[str, CommandExtension]:
    """name -> extension for every command registered in GROUP, by name; a name the product's own commands
    (``builtin``) already take is skipped (an extension cannot replace ``watch``). Never raises: a failed load
    is a Broken extension."""
    found: dict[str, CommandExtension] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        if ep.name in builtin or ep.name in found:
            continue
        try:
            obj = ep.load()
            if not all(hasattr(obj, a) for a in ("help", "add_arguments", "run")):
                raise TypeError("it has no help, add_arguments and run")
            found[ep.name] = obj
        except Exception as e:  # any failure of someone else's code: named, not our traceback
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            found[ep.name] = Broken(ep.name, f"command {ep.name} ({ep.value}) failed to load: {first}")
    return found
