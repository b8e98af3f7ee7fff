"""``--help`` at the terminal's width: argparse's RawDescriptionHelpFormatter printed descriptions and epilogs as
written, so an 80-column terminal got a 605-character paragraph on one line; HelpFormatter re-wraps everything,
examples included, which breaks commands apart. This formatter re-wraps prose and keeps what is indented.

Rules for a description or epilog (``_fill_text``), at ``width`` columns (argparse takes it from $COLUMNS, else
the terminal, minus 2):

- lines that start at column 0 are prose: consecutive ones are one paragraph, re-wrapped to the width; a blank
  line ends a paragraph, and a line ending in ``:`` (``examples:``) stands alone;
- indented lines (examples, tables) are kept as written when they fit. One that does not: a trailing shell
  comment (`` # ...`` after a command) goes on a line of its own above the command, a comment line is wrapped
  as comment lines, and any other (a table row) wraps with its continuation under its second column;
  a command is never split (a test holds every command of the help to the width: shorten it there).
"""

from __future__ import annotations

import argparse
import re
import textwrap

_COMMENT = re.compile(r"^(?P<code>\s+\S.*?)\s+(?P<comment>#\s.*)$")
_SECOND_COLUMN = re.compile(r"^(\s+\S+(?:\s\S+)*?\s{2,})\S")


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False) or [first.rstrip()]


def _indented(line: str, width: int) -> list[str]:
    """An indented line at ``width``: as written when it fits, else by the module's rules."""
    if len(line) <= width:
        return [line]
    indent = line[:len(line) - len(line.lstrip())]
    m = _COMMENT.match(line)
    if m:
        return _indented(f"{indent}{m.group('comment')}", width) + _indented(m.group("code"), width)
    stripped = line.strip()
    if stripped.startswith("# "):
        return _wrap(stripped[2:], width, indent + "# ", indent + "# ")
    col = _SECOND_COLUMN.match(line)
    hang = " " * len(col.group(1)) if col and len(col.group(1)) < width // 2 else indent + "    "
    if col and len(col.group(1)) < width // 2:
        return _wrap(line[len(col.group(1)):], width, col.group(1), hang)
    return [line]  # a command: kept whole (tests/commands/test_help_width.py holds them to the width)


def fill(text: str, width: int, indent: str = "") -> str:
    """``text`` (a description or epilog) laid out at ``width`` columns, each line prefixed by ``indent``."""
    width = max(width - len(indent), 20)
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.extend(_wrap(" ".join(w.strip() for w in para), width, "", ""))
            para.clear()

    for line in text.splitlines():
        if not line.strip():
            flush()
            out.append("")
        elif line[0].isspace():
            flush()
            out.extend(_indented(line.rstrip(), width))
        else:
            para.append(line)
            if line.rstrip().endswith(":"):
                flush()
    flush()
    return "\n".join(indent + line if line else line for line in out)


class WrappingHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Prose re-wrapped to the width, examples and tables kept as written (the module's rules)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return fill(text, width + len(indent), indent)
