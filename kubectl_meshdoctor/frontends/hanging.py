"""Lines wrapped to a width with a hanging indent: a wrapped line goes on under its own text, never at the left
edge where the next item starts (issue 32: "the evidence wraps without an indent"). Widths are terminal cells
(rich.cells), so a wide character from the traffic counts twice; a word longer than the room is cut between
cells, never left to run past the edge."""

from __future__ import annotations

import re

from rich.cells import cell_len, get_character_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

MORE = 2  # a continuation's indent beyond its line's own
# A word and the spaces after it; a `code span` (a command to copy) is one word: broken only when wider than a line.
_WORD = re.compile(r"(?:`[^`]*`|`(?![^`]*`)|[^ `])+ *| +")


def _chop(word: str, room: int) -> tuple[str, str]:
    """``word`` cut after at most ``room`` cells (at least one character: a wide one in a room of one goes whole)."""
    used = 0
    for i, ch in enumerate(word):
        used += get_character_cell_size(ch)
        if used > room:
            return (word[:i], word[i:]) if i else (word[:1], word[1:])
    return word, ""


def hang(line: str, width: int, indent: int | None = None, prose: bool = False) -> list[str]:
    """``line`` in lines of at most ``width`` cells, broken at spaces (a longer word between cells); each line
    after the first starts with ``indent`` spaces (None: the line's own leading spaces and MORE), at most half
    the width. With ``prose``, a line that starts at the edge goes on at the edge (a paragraph), and a YAML
    comment (``# ...``) goes on as a comment (``#   ...``): a fix copied off the screen still parses. A line
    that fits is returned as it is."""
    if width < 2 or cell_len(line) <= width:
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    body = line[lead:]
    if prose and body.startswith("#"):
        hashes = len(body) - len(body.lstrip("#"))
        after = len(body[hashes:]) - len(body[hashes:].lstrip(" "))
        pad = line[:lead + hashes] + " " * min(after + MORE, width // 2)
    else:
        pad = " " * min((0 if prose and not lead else lead + MORE) if indent is None else indent, width // 2)
    out: list[str] = []
    current = line[:lead]
    for token in _WORD.findall(line[lead:]):
        word = token.rstrip(" ")
        if current.strip() and cell_len(current + word) > width:
            out.append(current.rstrip(" "))
            current = pad
        while cell_len(current + word) > width:
            room = width - cell_len(current)
            head, rest = _chop(word, room)
            if cell_len(head) > room and current != pad:  # a wide character at the edge: on a line of its own
                out.append(current.rstrip(" "))
                current = pad
                continue
            out.append(current + head)
            current, word = pad, rest
        current += word + token[len(token.rstrip(" ")):]
    out.append(current.rstrip(" "))
    return out


class Hanging:
    """A Rich renderable of plain ``text``'s lines, each wrapped to the width it is drawn at (``hang``): the
    TUI's detail keeps its hanging indents at any terminal width, and after a resize."""

    def __init__(self, text: str, indent: int | None = None, prose: bool = False) -> None:
        self.lines = text.split("\n")
        self.indent = indent
        self.prose = prose

    def __str__(self) -> str:
        """The text as given, unwrapped (what a search of the pane's text finds)."""
        return "\n".join(self.lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        wrapped = [part for line in self.lines for part in hang(line, width, self.indent, self.prose)]
        yield Text("\n".join(wrapped), overflow="fold")  # fold: what hang could not keep in is never cut

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        longest = max((cell_len(line) for line in self.lines), default=0)
        return Measurement(min(longest, options.max_width // 2), min(longest, options.max_width))
