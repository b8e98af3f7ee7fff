"""Issue 29, item 1, for the reports: the traffic's control bytes never reach a terminal through `-o text` or
`-o markdown` (a ticket is read in one too); each shows as its escape. frontends/shown.py's rules, as properties."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from kubectl_meshdoctor.frontends.shown import block, is_safe, one_line

from .tui.test_hostile_text import HOSTILE, UF, UNSAFE


@given(st.text())
def test_one_line_is_printable_and_one_line(text):
    shown = one_line(text)
    assert is_safe(shown) and "\n" not in shown
    assert not any(ch in shown for ch in UNSAFE)


@given(st.text())
def test_block_keeps_its_lines_and_escapes_the_rest(text):
    shown = block(text)
    assert is_safe(shown, lines=True) and shown.count("\n") == text.count("\n")


def test_printable_text_is_left_as_it_is():
    for text in ("GET /p[/x] HTTP/1.1", "ümlaut ✓ 中文", "tab\there"):
        assert block(text) == text


def test_a_long_value_says_how_much_was_cut():
    assert one_line("x" * 10, limit=4) == "xxxx... (6 more characters)"


def test_reports_escape_the_traffics_control_bytes(tmp_path):
    for i, (path, agent) in enumerate(HOSTILE.items()):
        log = tmp_path / f"istio-proxy-{i}.log"
        log.write_text(UF.format(path=path, agent=agent, n=i) + "\n")
        for fmt in ("text", "markdown"):
            proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "-o", fmt],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 1, proc.stderr
            assert not [ch for ch in UNSAFE if ch in proc.stdout + proc.stderr], (path, fmt)
            assert one_line(path, limit=200)[:200] in proc.stdout, (path, fmt)


def test_an_error_line_escapes_a_hostile_file_name(tmp_path):
    """A file name is the user's, but may come from the traffic (a pod name, a pasted path): the one error line
    shows it escaped."""
    hostile = tmp_path / "a\x1b[2Jb\x07.log"
    hostile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(hostile)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "a\\x1b[2Jb\\x07.log" in proc.stderr
    assert not [ch for ch in UNSAFE if ch in proc.stderr]


def test_markdown_shows_the_traffics_text_as_written_not_as_markup(tmp_path):
    """Found by a break-it review: a ticket renders the -o markdown it is given, and a request target is the
    traffic's: `[login](https://...)` must not become a link, nor `<img onerror=...>` an element. Rendered by
    markdown-it (CommonMark with tables, as Textual ships it)."""
    import markdown_it

    path = "/[login](https://evil.example/)<img src=x onerror=alert(1)>*b*_c_"
    log = tmp_path / "istio-proxy.log"
    log.write_text(UF.format(path=path, agent="curl", n=1) + "\n")
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(log), "-o", "markdown"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(proc.stdout)
    assert 'href="https://evil' not in html and "<img" not in html and "<em>" not in html
    assert "/[login](https://evil.example/)&lt;img src=x onerror=alert(1)&gt;*b*_c_" in html  # shown as written
    assert "<code>" in html  # our own code spans are still code
