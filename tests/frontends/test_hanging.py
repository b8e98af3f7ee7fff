"""frontends/hanging.py: lines wrapped to a width in terminal cells with a hanging indent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from kubectl_meshdoctor.frontends.hanging import hang


def test_a_wrapped_evidence_line_goes_on_under_its_own_text():
    line = "  eth0.pcap frame 20: challenge ACK (ack 324538907, not SYN seq+1 3857022855)"
    assert hang(line, 40) == ["  eth0.pcap frame 20: challenge ACK (ack",
                              "    324538907, not SYN seq+1 3857022855)"]
    assert hang(line, 200) == [line]  # a line that fits is as it was


def test_a_word_longer_than_the_width_is_cut_between_cells_and_a_wide_character_never_split():
    assert hang("  /a/very/long/path/of/a/capture.pcap frame 6", 16) == [
        "  /a/very/long/p", "    ath/of/a/cap", "    ture.pcap", "    frame 6"]
    wide = hang("x " + "界" * 10, 7)
    assert all(cell_len(part) <= 7 for part in wide) and "".join(wide).replace(" ", "") == "x" + "界" * 10


def test_a_given_indent_is_used_for_every_continuation():
    row = "    +0.000 │──────▶│  #19 SYN"
    assert hang(row, 24, indent=12) == ["    +0.000 │──────▶│", " " * 12 + "#19 SYN"]
    assert hang(row, 20, indent=12)[1] == " " * 10 + "#19 SYN"  # at most half the width


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("ab cd\u754c\u00e9  ")), max_size=200), st.integers(4, 120),
       st.one_of(st.none(), st.integers(0, 30)))
def test_nothing_is_lost_and_no_line_passes_the_width(line, width, indent):
    out = hang(line, width, indent)
    assert "".join(out).replace(" ", "") == line.replace(" ", "")
    assert all(cell_len(part) <= width for part in out)


def test_prose_goes_on_at_the_edge_and_a_yaml_comment_as_a_comment():
    paragraph = "Istio REDIRECTs inbound ports to 15006, so the SYN and its live connection are one four-tuple"
    wrapped = hang(paragraph, 30, prose=True)
    assert len(wrapped) > 2 and all(x[:1] != " " and len(x) <= 30 for x in wrapped)
    comment = "# Fix 1 of 3 (tproxy): intercept inbound traffic with TPROXY instead of REDIRECT"
    assert hang(comment, 40, prose=True) == ["# Fix 1 of 3 (tproxy): intercept inbound",
                                             "#   traffic with TPROXY instead of",
                                             "#   REDIRECT"]
    nested = "#   costs: the injector runs istio-proxy as root"
    assert hang(nested, 30, prose=True)[1].startswith("#     ")
    value = "    sidecar.istio.io/interceptionMode: TPROXY plus more"
    assert hang(value, 30, prose=True)[1].startswith("      ")


def test_a_code_span_is_one_word():
    line = "  read it with `kubectl logs POD -c istio-proxy` and then more words"
    out = hang(line, 40)
    assert "`kubectl logs POD -c istio-proxy`" in "\n".join(out) and all(len(x) <= 40 for x in out)
    assert hang("an odd ` backtick here", 10) == ["an odd `", "  backtick", "  here"]
