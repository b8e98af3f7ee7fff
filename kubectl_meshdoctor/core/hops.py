"""One request across the hops of a mesh: each sidecar on its path logs it, the callers' on an outbound cluster,
the servers' on their inbound cluster, under other flags.

A server sidecar's ``503 UF`` reaches the caller as ``503 - via_upstream`` (``URX`` where 503s are retried), its
``502 UPE`` as ``502 - via_upstream``: the caller's line is the user's 503, the server's tells why. When several
pods' logs were read, the findings of one request are one finding that quotes every hop's line, in path order
(the first caller's first), so each failing request is told once:

- a caller's finding of a relayed answer (every line via_upstream on an outbound cluster) goes into the finding
  of the hop that answered it; where the server's line is a relay too (its app passed on the answer of a call
  it made for the request: the same x-request-id, logged while the request was served), on to the next hop;
- a caller's finding of a connection the server's listener ended, saying so in a line of no cluster (``0 NR
  filter_chain_not_found``, paired by the hop's four-tuple), goes into the finding that quotes that line;
- a server-side finding of its downstream going away (every line DC on its inbound cluster) goes into the
  caller's finding of the same request: the caller's sidecar gave up (its route timeout: 504 UT), or its client;
- a finding of the app's own answer (every line a 5xx via_upstream on an inbound cluster: the app answered it,
  the sidecar passed it on) goes where the request's path goes on (the app's answer to a call of its own that
  failed), else into the caller's finding of the same request, which quotes the line that relayed it;
- a 5xx a sidecar logged that no finding quotes (``LoggedLine``: the app's own 500, relayed) goes to the finding
  of its request's neighbouring line.
Folds compose: each chain of them ends at one kept finding, and none ends at a finding that is itself folded; a
cycle (which two relays of one line would make) is cut at its first finding. A real failure's finding is never
folded into another. Which lines are the same request at one hop is core/hop_pairs.py's rule: the hop's
four-tuple, else the server pod's address and the x-request-id within JOIN_WINDOW_S, else a unique
x-request-id; each line pairs once, the nearest in time first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry

from .findings import Evidence, Finding
from .hop_pairs import HopLine, HopLinks, caller_side, direction, links, parsed_lines, server_sides
from .wire_join import one_request, same_connection

RELAYED = "via_upstream"
REAL, RELAY, GONE, APP, ENDED = "real", "relay", "gone", "app", "ended"  # a finding's part in a request's path


@dataclass(frozen=True, slots=True)
class LoggedLine:
    """A 5xx answer a pod's sidecar logged that none of its findings quotes (the app's own 500, passed on): the
    pod, the line as quoted, parsed, and where it was read. join_hops gives it to the finding of its request's
    neighbouring line."""

    pod: str | None
    text: str
    entry: AccessLogEntry
    evidence: Evidence


def relayed_only(f: Finding, entries: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """``entries`` (``f``'s access-log lines, parsed) when every one of its lines is a caller's sidecar passing on
    what the next hop answered (details via_upstream on an outbound cluster); [] otherwise: a failure of the
    caller's own, or a line not read."""
    if not entries or len(entries) != len(f.access_log):
        return []
    return entries if all(e.details == RELAYED and direction(e) == "outbound" for e in entries) else []


def relayed_through(f: Finding, entries: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """``entries`` when ``f`` is a pod passing on the answer of the call its app made (an earlier join of one
    pod's lines, a chain's middle: its app's 5xx on its inbound cluster, app_answered, and its sidecar's relay of
    the call, via_upstream on an outbound cluster, at least one of those); [] otherwise. Such a finding goes on
    to the hop that answered the call, as a caller's relay does."""
    if not entries or len(entries) != len(f.access_log):
        return []
    relays = [e.details == RELAYED and direction(e) == "outbound" for e in entries]
    return entries if any(relays) and all(r or app_answered(e) for r, e in zip(relays, entries)) else []


def server_disconnect_only(f: Finding, entries: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """``entries`` (``f``'s access-log lines, parsed) when every one is the server pod's sidecar seeing its
    downstream go away (DC on its inbound cluster): the caller's doing, told by the caller's own line; []
    otherwise."""
    if not entries or len(entries) != len(f.access_log):
        return []
    return entries if all("DC" in e.flags and direction(e) == "inbound" for e in entries) else []


def app_answered(entry: AccessLogEntry) -> bool:
    """A server sidecar passing on its app's 5xx: details via_upstream on an inbound cluster (Envoy's
    response_code_details.rst: "The response code was set by the upstream", here the app)."""
    return entry.code >= 500 and entry.details == RELAYED and direction(entry) == "inbound"


def app_answered_only(f: Finding, entries: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """``entries`` when every one of ``f``'s lines is its app's 5xx, passed on (app_answered); [] otherwise."""
    if not entries or len(entries) != len(f.access_log):
        return []
    return entries if all(map(app_answered, entries)) else []


def join_hops(findings: list[Finding], logged: Sequence[LoggedLine] = ()) -> list[Finding]:
    """``findings`` with each request's hops made one finding (join_requests, the module's rules), then one
    connection's eth0 seen from both its pods (same_connection) and the attempts of one retried request
    (one_request). Findings of nothing joined are kept as they are, in order."""
    return one_request(same_connection(join_requests(findings, logged)))


@dataclass(slots=True)
class _Join:
    """The lines of a join and who quotes each: ``owner`` a finding's index, or None for a ``logged`` line."""

    lines: list[HopLine]
    texts: list[str]
    owner: list[int | None]
    logged: dict[int, LoggedLine]
    kind: list[str]
    nodes: list[list[int]]
    links: HopLinks

    def forward(self, s: int | None) -> int | None:
        """The finding the request's path reaches from server line ``s`` on: a real failure, or a caller's relay
        further on; None where it ends at an app's answer or a disconnect."""
        seen: set[int] = set()
        while s is not None and s not in seen:
            seen.add(s)
            o = self.owner[s]
            if o is not None and self.kind[o] in (REAL, GONE):
                return o if self.kind[o] == REAL else None
            out = self.links.onward.get(s)
            if out is None:
                return None
            if self.owner[out] is not None:
                return self.owner[out]
            s = self.links.server_of.get(out)
        return None

    def backward(self, s: int) -> int | None:
        """The finding of the caller's line of server line ``s``'s request, through lines no finding quotes."""
        c = self.links.caller_of.get(s)
        seen: set[int] = set()
        while c is not None and c not in seen:
            seen.add(c)
            if self.owner[c] is not None:
                return self.owner[c]
            inn = self.links.inward.get(c)
            if inn is None:
                return None
            if self.owner[inn] is not None:
                return self.owner[inn]
            c = self.links.caller_of.get(inn)
        return None

    def ended(self, i: int) -> bool:
        """Whether every line of finding ``i`` is a caller's of a connection the server's listener ended and said
        so in a line of no cluster (``0 NR filter_chain_not_found``) that another finding quotes."""
        ends = [self.links.server_of.get(n) for n in self.nodes[i]]
        return bool(ends) and all(caller_side(self.lines[n].entry) for n in self.nodes[i]) and all(
            s is not None and self.lines[s].entry.upstream_cluster is None and self.owner[s] not in (None, i)
            for s in ends)

    def target(self, i: int) -> int | None:
        """Where finding ``i`` folds (the module's rules), or None: it is kept."""
        for n in self.nodes[i]:
            if self.kind[i] == ENDED:
                t = self.owner[self.links.server_of[n]]
            elif self.kind[i] == RELAY:
                t = self.forward(self.links.server_of.get(n))
            elif self.kind[i] == GONE:
                c = self.links.caller_of.get(n)
                t = self.owner[c] if c is not None else None
            elif self.kind[i] == APP:
                t = self.forward(n)
                t = t if t is not None and t != i else self.backward(n)
            else:
                return None
            if t is not None and t != i:
                return t
        return None

    def neighbour(self, n: int) -> int | None:
        """The finding nearest to logged line ``n`` along its request's path (pairs before links), or None."""
        todo, seen = [n], {n}
        while todo:
            k = todo.pop(0)
            if self.owner[k] is not None:
                return self.owner[k]
            for m in (self.links.server_of.get(k), self.links.caller_of.get(k), self.links.inward.get(k),
                      self.links.onward.get(k)):
                if m is not None and m not in seen:
                    seen.add(m)
                    todo.append(m)
        return None


def _kind(f: Finding, entries: list[AccessLogEntry]) -> str:
    if relayed_only(f, entries) or relayed_through(f, entries):
        return RELAY
    if server_disconnect_only(f, entries):
        return GONE
    return APP if app_answered_only(f, entries) else REAL


def _roots(target: dict[int, int]) -> dict[int, int]:
    """Each folded finding -> the kept finding its chain of folds ends at; a cycle is cut at its first member."""
    out: dict[int, int] = {}
    for start in sorted(target):
        path, k = [], start
        while k in target and k not in out and k not in path:
            path.append(k)
            k = target[k]
        if k in path:  # a cycle: its member met first is kept
            del target[k]
            path = path[:path.index(k)] + path[path.index(k) + 1:]
        root = out.get(k, k)
        for p in path:
            out[p] = root
    return out


def join_requests(findings: list[Finding], logged: Sequence[LoggedLine] = ()) -> list[Finding]:
    """``findings`` with the findings of one request on several hops made one, and each ``logged`` line of a
    request one of them joins given to it (the module's rules); each line still quoted once."""
    parsed = [parsed_lines(f) for f in findings]  # each finding's lines read once: parse_line tries every format
    lines, texts, owner, nodes = [], [], [], []
    for i, (f, pl) in enumerate(zip(findings, parsed)):
        nodes.append([])
        for text, e in pl:
            nodes[i].append(len(lines))
            lines.append(HopLine(f.pod, e))
            texts.append(text)
            owner.append(i)
    given: dict[int, LoggedLine] = {}
    for x in logged:
        given[len(lines)] = x
        lines.append(HopLine(x.pod, x.entry))
        texts.append(x.text)
        owner.append(None)
    callers = [k for k, h in enumerate(lines) if caller_side(h.entry)]
    servers = server_sides(lines, callers)
    kinds = [_kind(f, [e for _, e in pl]) for f, pl in zip(findings, parsed)]
    join = _Join(lines, texts, owner, given, kinds, nodes, links(lines, callers, servers))
    for i in range(len(findings)):
        if kinds[i] == REAL and join.ended(i):
            kinds[i] = ENDED
    target = {i: t for i in range(len(findings)) if (t := join.target(i)) is not None}
    roots = _roots(target)
    members: dict[int, list[int]] = {}
    for i in sorted(roots):
        members.setdefault(roots[i], []).append(i)
    extra: dict[int, list[int]] = {}
    for n in sorted(given):
        o = join.neighbour(n)
        if o is not None:
            extra.setdefault(roots.get(o, o), []).append(n)
    if not members and not extra:
        return findings
    depth = join.links.depth()
    out = []
    for i, f in enumerate(findings):
        if i in roots:
            continue
        if i in members or i in extra:
            f = _joined(f, nodes[i], [(findings[m], nodes[m], kinds[m]) for m in members.get(i, ())],
                        extra.get(i, ()), join, depth)
            app = next((findings[m] for m in members.get(i, ()) if kinds[m] == APP), None)
            if kinds[i] == RELAY and app is not None:
                # The server pod's side, read, says its app answered: the relay's "read the next hop" is done, and
                # what is left to do is the app's (its log for the request).
                f = replace(f, fixes=app.fixes, remediation=app.remediation)
        out.append(f)
    return out


def _joined(f: Finding, own: list[int], folded: list[tuple[Finding, list[int], str]], extra: Sequence[int],
            join: _Join, depth: dict[int, int]) -> Finding:
    """``f`` (its lines ``own``) quoting the lines of ``folded`` (findings with their lines and kinds) and of
    ``extra`` (logged lines), each told in ``details["hops"]`` and its explanation, its lines in path order (the
    first caller's first; a line not read last, in the order quoted)."""
    def place(k: int) -> tuple[int, float]:
        return depth.get(k, 0), join.lines[k].entry.ts

    node_of = {join.texts[k]: k for k in own}
    pairs = f.quoted_lines()
    told = []
    for other, ks, _ in sorted(folded, key=lambda x: min(map(place, x[1]), default=(0, 0.0))):
        f = replace(f, evidence=f.evidence + tuple(x for x in other.evidence if x not in f.evidence),
                    envoy_log=f.envoy_log + tuple(x for x in other.envoy_log if x not in f.envoy_log))
        pairs += other.quoted_lines()
        node_of.update({join.texts[k]: k for k in ks})
        told += [(other.pod, k, "caller" if caller_side(join.lines[k].entry) else "server") for k in ks]
    for n in sorted(extra, key=place):
        x = join.logged[n]
        f = replace(f, evidence=f.evidence + (x.evidence,))
        pairs.append((x.text, x.entry))
        node_of[x.text] = n
        told.append((x.pod, n, "caller" if caller_side(x.entry) else "server"))
    told.sort(key=lambda t: place(t[1]))  # hop by hop, as the lines
    unique = list({t: (t, e) for t, e in reversed(pairs)}.values())[::-1]  # each line once, first quote kept
    known = sorted((p for p in unique if p[0] in node_of), key=lambda p: place(node_of[p[0]]))
    pairs = known + [p for p in unique if p[0] not in node_of]
    hops = list(f.details.get("hops", ())) + [
        {"pod": pod, "role": role, "logged": _said(join.lines[k].entry),
         "cluster": join.lines[k].entry.upstream_cluster, "request_id": join.lines[k].entry.request_id}
        for pod, k, role in told]
    hops = _in_line_order(hops, [e for _, e in pairs])
    explanation = f.explanation
    for sentence in dict.fromkeys(_sentence(pod, join.lines[k].entry, k in join.links.onward) for pod, k, _ in told):
        if sentence not in explanation:  # several requests relayed alike: said once
            explanation += sentence
    return replace(f, access_log=tuple(t for t, _ in pairs), entries=tuple(e for _, e in pairs),
                   explanation=explanation, details={**f.details, "hops": hops})


def _in_line_order(hops: list[dict], entries: list[AccessLogEntry | None]) -> list[dict]:
    """``hops`` (an earlier join's too) in the order of the lines each names; one naming none last."""
    keys = [(_said(e), e.upstream_cluster, e.request_id) if e is not None else None for e in entries]
    taken: set[int] = set()

    def at(h: dict) -> int:
        key = (h.get("logged"), h.get("cluster"), h.get("request_id"))
        k = next((k for k, x in enumerate(keys) if x == key and k not in taken), len(keys))
        taken.add(k)
        return k

    return sorted(hops, key=at) if all(isinstance(h, dict) for h in hops) else hops


def _said(e: AccessLogEntry) -> str:
    return f"{e.code} {','.join(e.flags) or '-'} {e.details}"


def _sentence(pod: str | None, e: AccessLogEntry, called_on: bool) -> str:
    """What the joined line of ``pod`` says to this finding; ``called_on``: its request went on from that pod's
    app to a call of its own (a chain)."""
    if caller_side(e) and e.details != RELAYED:
        who = f"pod {pod}'s sidecar" if pod else "the caller's sidecar"
        return (f" The caller saw it through {who}, which logged the same connection as {_said(e)}: what the "
                f"server's listener did to it, seen from the caller.")
    if caller_side(e):
        who = f"pod {pod}'s sidecar" if pod else "the caller's sidecar"
        return (f" The caller saw it through {who}, which logged the same request as {_said(e)}: this hop's "
                f"answer, passed on.")
    who = f"pod {pod}'s sidecar" if pod else "the server pod's sidecar"
    if app_answered(e) and called_on:
        return (f" Pod {pod or '?'}'s app answered its caller {e.code} (its sidecar logged {_said(e)} on its inbound "
                f"cluster): the answer of the call it made for the request, this finding, passed on.")
    if app_answered(e):
        return (f" The server, {who}, logged the same request as {_said(e)} on its inbound cluster: its app "
                f"answered {e.code}, and the sidecars only passed it on (not a failure of the mesh).")
    return (f" The next hop, {who}, logged the same request as {_said(e)}: it saw this side go away, the effect "
            f"of this finding, not a failure of its own.")
