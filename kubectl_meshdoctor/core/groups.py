"""Findings grouped into problems: real incidents repeat, and a hundred challenge ACKs of one collision are one
problem seen a hundred times, not a hundred problems. The TUI lists groups, the text and markdown reports
describe them, and `-o json` keeps every instance and adds the groups.

A group is the findings alike in severity, detector, pod, server endpoint, Envoy response flags and
``Finding.variant`` (what tells findings of one detector apart: the framing violation, a refusal's cause). A
finding of a pod's spec (lint, no flow) groups over pods: one rule that many replicas break is one problem.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .findings import Finding

GroupKey = tuple[int, str, str, str, tuple[str, ...], str]  # -severity rank, detector, pod, server, flags, variant


def group_key(f: Finding) -> GroupKey:
    if not f.flow.of_one_connection:
        # A finding of a pod's spec (lint): one rule broken by many replicas is one problem over those pods.
        return (-f.severity.rank, f.detector, "", "", f.envoy_flags, f.variant or f.title)
    return (-f.severity.rank, f.detector, f.pod or "", f.flow.server, f.envoy_flags, f.variant)


@dataclass(slots=True)
class FindingGroup:
    """One problem: its ``instances`` in the order they were seen (at least one)."""

    key: GroupKey
    instances: list[Finding] = field(default_factory=list)
    on_packets: bool = False  # some instance stands on packets (Grouper.add keeps it): such groups sort first

    @property
    def first(self) -> Finding:
        return self.instances[0]

    @property
    def newest(self) -> Finding:
        return self.instances[-1]

    @property
    def shown(self) -> Finding:
        """The instance a report shows in full: the one that stands on the most kinds of evidence (one Envoy's
        debug log proves beats one the access log alone makes likely), the newest among those."""
        return max(reversed(self.instances), key=lambda f: len(f.stands_on))

    def stands_on_counts(self) -> dict[str, int]:
        """How many instances stand on each kind of evidence (Finding.stands_on), in that order."""
        counts: dict[str, int] = {}
        for f in self.instances:
            for kind in f.stands_on:
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    @property
    def count(self) -> int:
        return len(self.instances)

    @property
    def first_ts(self) -> float:
        """Seconds since the epoch of the first instance's deciding packet (or log line)."""
        return min(f.ts for f in self.instances)

    @property
    def last_ts(self) -> float:
        return max(f.ts for f in self.instances)

    @property
    def rate_per_min(self) -> float | None:
        """Instances per minute between the first and the last; None for one instance or one instant."""
        span = self.last_ts - self.first_ts
        return (self.count - 1) * 60.0 / span if self.count > 1 and span > 0 else None

    @property
    def label(self) -> str:
        """The part of the finding that tells this group from the others of its detector: the variant, else
        the newest instance's title."""
        return self.newest.variant or self.newest.title

    @property
    def counters(self) -> dict:
        """The run's counters that back this problem (Envoy's and the kernel's, name -> delta), once: they are
        run-wide totals attached to every instance, not each instance's own."""
        out: dict = {}
        for f in self.instances:
            out.update(f.counters)
        return out

    def span_text(self) -> str:
        """``3 times in 2 min 58 s (1.0/min)``, or ``once``."""
        if self.count == 1:
            return "once"
        span = self.last_ts - self.first_ts
        when = f"{int(span // 60)} min {span % 60:.0f} s" if span >= 60 else f"{span:.1f} s"
        rate = self.rate_per_min
        return f"{self.count} times in {when}" + (f" ({rate:.1f}/min)" if rate is not None else "")


class Grouper:
    """Groups findings as they arrive (the TUI) or all at once (``group_findings``)."""

    def __init__(self) -> None:
        self._groups: dict[GroupKey, FindingGroup] = {}

    def add(self, f: Finding) -> tuple[FindingGroup, bool]:
        """File ``f`` in its group; returns the group and whether ``f`` started it."""
        key = group_key(f)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = FindingGroup(key)
        group.instances.append(f)
        group.on_packets = group.on_packets or "packets" in f.stands_on
        return group, group.count == 1

    def groups(self) -> list[FindingGroup]:
        """Most severe first, then those with packet evidence (what the wire showed comes before what a log line
        alone suggests: a log covers more time than the capture beside it), then by when each was first seen."""
        return sorted(self._groups.values(),
                      key=lambda g: (g.key[0], not g.on_packets, g.first_ts))


def group_findings(findings: Iterable[Finding]) -> list[FindingGroup]:
    """``findings`` as groups (most severe first, then first seen), each group's instances in time order."""
    grouper = Grouper()
    for f in sorted(findings, key=lambda f: f.ts):
        grouper.add(f)
    return grouper.groups()
