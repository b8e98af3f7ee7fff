"""The fixes a finding offers: each named, with what it keeps of the mesh and what it costs, in the order a
detector prints them (what keeps the most first).

A fix's ``name`` is what the lab applies (``lab up --pods SCENARIO --fix NAME``) and what its lab test proves
removes the failure; its text in reports and the TUI is rendered from the same object (``remediation``), so what
a user pastes is what the test applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fix:
    """One remedy.

    ``title`` says what to do (one line); ``keeps`` what of the mesh stays (mTLS, policy, telemetry ...) and
    ``costs`` what it gives up or needs; ``yaml`` is what to apply (YAML or commands to paste, ``<service>`` and
    ``<namespace>`` for the user to fill in). ``annotations`` and ``labels`` are the pod template annotations and
    labels the fix sets, as (name, value): when given, they are the YAML (so the lab applies exactly what is
    printed). ``settings`` are
    the Istio fields the YAML sets, as (``Kind.path.to.field``, value), e.g.
    ``("DestinationRule.trafficPolicy.connectionPool.http.idleTimeout", "0.8s")``: what the lab applies."""

    name: str
    title: str
    keeps: str
    costs: str
    yaml: str = ""
    annotations: tuple[tuple[str, str], ...] = ()
    settings: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"fix name {self.name!r}: lower-case words joined by '-'")
        if not self.yaml and not self.annotations and not self.labels:
            raise ValueError(f"fix {self.name}: nothing to apply (no yaml, no annotations, no labels)")

    @property
    def text(self) -> str:
        """What to apply: ``yaml``, or the pod template annotations."""
        if self.yaml:
            return self.yaml
        lines = ["# pod template (spec.template.metadata of the Deployment):", "metadata:"]
        for key, pairs in (("annotations", self.annotations), ("labels", self.labels)):
            if pairs:
                lines += [f"  {key}:", *(f'    {k}: "{v}"' for k, v in pairs)]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The report's ``fixes[]`` entry (docs/DESIGN.md, report schema)."""
        out = {"name": self.name, "title": self.title, "keeps": self.keeps, "costs": self.costs, "text": self.text}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.settings:
            out["settings"] = dict(self.settings)
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


def render(fixes: Sequence[Fix], note: str = "") -> str:
    """A finding's ``remediation`` text: each fix in order, a YAML document of its own (``---`` between them),
    headed by comment lines with its number, name, what it keeps and what it costs, then what to apply;
    ``note`` (comment lines, no fix of its own) at the end."""
    parts = []
    for i, fix in enumerate(fixes, start=1):
        head = [f"# Fix {i} of {len(fixes)} ({fix.name}): {fix.title}", f"#   keeps: {fix.keeps}",
                f"#   costs: {fix.costs}"]
        parts.append("\n".join(head) + "\n" + fix.text)
    if note:
        parts.append(note)
    return "\n---\n".join(parts)


def note_of(remediation: str, fixes: Sequence[Fix]) -> str:
    """The note ``render`` put after ``fixes`` in ``remediation`` ("" when there is none, or the text is not
    theirs)."""
    rendered = render(fixes)
    if not fixes or not remediation.startswith(rendered):
        return ""
    return remediation[len(rendered):].removeprefix("\n---\n")


def named(fixes: Sequence[Fix], name: str) -> Fix:
    """The fix called ``name``. Raises KeyError naming the fixes there are."""
    for fix in fixes:
        if fix.name == name:
            return fix
    raise KeyError(f"no fix {name!r}; there are: {', '.join(f.name for f in fixes)}")
