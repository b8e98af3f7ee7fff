"""``kubectl_complete-meshdoctor``: shell completion of ``kubectl meshdoctor ...``.

kubectl >= 1.26 completes a plugin's arguments by running the executable ``kubectl_complete-<plugin>`` it finds on
PATH with the words typed after the plugin's name, the last one being the word to complete ("" for a new word),
and reads its stdout as cobra's ``__complete`` protocol: one completion a line (``value<TAB>description``), then
``:<directive>`` (kubernetes/kubectl pkg/cmd/plugin/plugin_completion.go, spf13/cobra completions.go). Its stderr
goes to the user's terminal mid-completion, so nothing is written there unless MESHDOCTOR_DEBUG is set.

Subcommands and flags come from ``cli.build_parser()``, so they cannot drift from what the command accepts. Pod,
deployment, namespace and context names are asked of the kubectl on PATH (the same credentials and plugins the
user's kubectl has), with a short deadline: a slow cluster costs a completion, never a hung shell.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

# cobra's ShellCompDirective bits (spf13/cobra completions.go).
ERROR = 1
NO_SPACE = 2
NO_FILE_COMP = 4
FILTER_DIRS = 16
DEFAULT = 0  # the shell's own completion: file names

# kubectl is asked for names with this deadline; a person pressing TAB waits for it.
KUBECTL_TIMEOUT_S = 3.0

TARGET_PREFIXES = ("pod/", "deploy/")


def _describe(text: str | None) -> str:
    """One line of help for the shells that show descriptions (zsh, fish); argparse's %% escapes undone."""
    if not text or text == argparse.SUPPRESS:
        return ""
    line = re.sub(r"\s+", " ", text.replace("%%", "%")).strip()
    return line if len(line) <= 80 else line[:77].rstrip() + "..."


def _line(value: str, help_text: str | None = None) -> str:
    desc = _describe(help_text)
    return f"{value}\t{desc}" if desc else value


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _option(parser: argparse.ArgumentParser, word: str) -> argparse.Action | None:
    action = parser._option_string_actions.get(word)
    if action is None and word.startswith("--") and parser.allow_abbrev:
        # argparse takes a unique prefix of a long flag (--kube for --kubeconfig): so must we, or its value
        # would be counted as a positional word.
        matches = {a for flag, a in parser._option_string_actions.items() if flag.startswith(word)}
        action = matches.pop() if len(matches) == 1 else None
    return action


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0  # store_true, help, version and count take none


class _State:
    """Where the words before the one being completed leave the command line."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        self.pending: argparse.Action | None = None  # a flag whose value is the next word
        self.positionals = 0  # positional words given to the current (sub)command
        self.only_positionals = False  # after "--"
        self.values: dict[str, str] = {}  # cluster flags typed so far, passed on to kubectl

    def feed(self, word: str) -> None:
        if self.pending is not None:
            self._remember(self.pending, word)
            self.pending = None
            return
        if word == "--" and not self.only_positionals:
            self.only_positionals = True
            return
        if word.startswith("-") and len(word) > 1 and not self.only_positionals:
            name, eq, value = word.partition("=")
            action = _option(self.parser, name)
            if action is None and not word.startswith("--"):
                action = _option(self.parser, word[:2])  # -nshop: a short flag with its value attached
                name, eq, value = word[:2], "=" if len(word) > 2 else "", word[2:]
            if action is not None and _takes_value(action):
                if eq:
                    self._remember(action, value)
                else:
                    self.pending = action
            return
        sub = _subcommands(self.parser)
        if sub is not None and self.positionals == 0 and word in sub.choices:
            self.parser = sub.choices[word]
            self.positionals = 0
            self.only_positionals = False
            return
        self.positionals += 1

    def _remember(self, action: argparse.Action, value: str) -> None:
        if action.dest in ("namespace", "context", "kubeconfig"):
            self.values[action.dest] = value

    def next_positional(self) -> argparse.Action | None:
        """The positional argument the next word fills, if any."""
        index = 0
        for action in self.parser._positionals._group_actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if action.nargs in ("+", "*", argparse.REMAINDER):
                return action if self.positionals >= index else None
            count = action.nargs if isinstance(action.nargs, int) else 1
            if self.positionals < index + count:
                return action
            index += count
        return None


def _kubectl_names(state: _State, *args: str) -> list[str]:
    """``kubectl ... -o name`` lines, with the cluster flags typed so far; [] on any failure."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return []
    flags = [f"--{k}={v}" for k, v in sorted(state.values.items()) if v]
    try:
        proc = subprocess.run([kubectl, *args, *flags, f"--request-timeout={int(KUBECTL_TIMEOUT_S)}s"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S + 1)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def _complete_target(state: _State, cur: str) -> tuple[list[str], int]:
    if "/" in cur:
        kind = cur.split("/", 1)[0].lower()
        if kind == "pod":
            names = _kubectl_names(state, "get", "pods", "-o", "name")  # prints pod/NAME already
        elif kind in ("deploy", "deployment"):
            names = [f"{kind}/{n.split('/', 1)[1]}" for n in _kubectl_names(state, "get", "deployments", "-o", "name")
                     if "/" in n]
        else:
            names = []
        return [n for n in names if n.startswith(cur)], NO_FILE_COMP
    prefixes = [p for p in TARGET_PREFIXES if p.startswith(cur)]
    if prefixes or not cur:
        return prefixes, NO_SPACE | NO_FILE_COMP
    # A bare NAME is a pod (kube/target.py).
    pods = [n.split("/", 1)[1] for n in _kubectl_names(state, "get", "pods", "-o", "name") if "/" in n]
    return [n for n in pods if n.startswith(cur)], NO_FILE_COMP


def _complete_value(state: _State, action: argparse.Action, cur: str, prefix: str = "") -> tuple[list[str], int]:
    """Values of ``action``'s flag that start with ``cur``, each written after ``prefix`` (``--output=``)."""
    if action.choices:
        return [prefix + str(c) for c in action.choices if str(c).startswith(cur)], NO_FILE_COMP
    if action.dest == "namespace":
        names = [n.split("/", 1)[-1] for n in _kubectl_names(state, "get", "namespaces", "-o", "name")]
    elif action.dest == "context":
        names = _kubectl_names(state, "config", "get-contexts", "-o", "name")
    elif action.metavar == "DIR" or action.dest.endswith("_dir"):
        return [], FILTER_DIRS
    elif action.dest == "kubeconfig" or action.type is Path:
        return [], DEFAULT  # a file: the shell completes it
    else:
        return [], NO_FILE_COMP  # a number, a selector, a level: nothing to offer, and no file names
    return [prefix + n for n in names if n.startswith(cur)], NO_FILE_COMP


def _complete_flag(state: _State, cur: str) -> tuple[list[str], int]:
    name, eq, value = cur.partition("=")
    if eq:
        action = _option(state.parser, name)
        if action is None or not _takes_value(action):
            return [], NO_FILE_COMP
        return _complete_value(state, action, value, prefix=name + "=")
    lines = []
    for action in state.parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        for flag in action.option_strings:
            if flag.startswith(cur):
                lines.append(_line(flag, action.help))
    return lines, NO_FILE_COMP


def complete(words: list[str]) -> tuple[list[str], int]:
    """The completion lines and cobra directive for ``words``; the last word is the one being completed."""
    from .cli import build_parser  # lazily: the CLI module may be reorganised, build_parser stays there

    if not words:
        words = [""]
    state = _State(build_parser())
    for word in words[:-1]:
        state.feed(word)
    cur = words[-1]
    if state.pending is not None:
        return _complete_value(state, state.pending, cur)
    if cur.startswith("-") and not state.only_positionals:
        return _complete_flag(state, cur)
    sub = _subcommands(state.parser)
    if sub is not None and state.positionals == 0:
        helps = {a.dest: a.help for a in sub._choices_actions}
        return [_line(name, helps.get(name)) for name in sub.choices if name.startswith(cur)], NO_FILE_COMP
    action = state.next_positional()
    if action is None:
        return [], NO_FILE_COMP  # nothing more is accepted here
    if action.dest == "target" or "pod/" in str(action.metavar or ""):
        return _complete_target(state, cur)
    return [], DEFAULT  # capture files (analyze): the shell completes file names


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        lines, directive = complete(words)
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug of ours must not print a traceback into the user's prompt
        if os.environ.get("MESHDOCTOR_DEBUG"):
            traceback.print_exc()
        lines, directive = [], ERROR
    text = "".join(f"{line}\n" for line in lines) + f":{directive}\n"
    try:
        # Bytes, not the locale's codec: a word typed in another encoding (kept by Python as surrogate escapes)
        # is echoed back as the bytes the shell gave us, and a C locale cannot fail on a description.
        sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
