"""Save a finding's evidence as a pcapng file that Wireshark and ``analyze`` open.

What is saved: every packet of the finding's client endpoint on its interface (so a collision keeps both
connections of the client port, a stale keep-alive its whole pooled connection) from up to CONTEXT_BEFORE_S before
the first evidence packet to CONTEXT_AFTER_S after the last, plus the evidence frames themselves. tshark picks the
frames (it reads every link type we capture); dpkt copies their bytes unchanged into a pcapng whose interface
blocks carry the interface names (``lo``, ``eth0``), which is how ``analyze`` attributes packets again.
"""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubectl_meshdoctor.core.events import split_endpoint
from kubectl_meshdoctor.core.findings import Finding
from kubectl_meshdoctor.pcap_header import is_pcapng
from kubectl_meshdoctor.private_files import open_copy, replaceable

if TYPE_CHECKING:
    from dpkt import pcapng

CONTEXT_BEFORE_S = 300.0  # the flow table's idle limit: a peer connection older than this is not part of it
CONTEXT_AFTER_S = 5.0


class SaveError(Exception):
    """The evidence cannot be saved; the message is one line for the screen or stderr."""


@dataclass(frozen=True, slots=True)
class Saved:
    path: str
    packets: int
    frames: dict[str, list[int]]  # source -> the frame numbers copied from it


def selection_filter(f: Finding, source: str) -> str:
    """The tshark display filter that picks ``f``'s packets out of ``source``."""
    frames = sorted({e.frame for e in f.evidence if e.source == source and e.frame})
    times = [e.ts for e in f.evidence if e.source == source and e.frame]
    parts = [f"frame.number in {{{', '.join(map(str, frames))}}}"] if frames else []
    host, port = split_endpoint(f.connection.client) if f.connection is not None else ("", "")
    if host and port.isdigit() and times:
        addr = "ipv6.addr" if ":" in host else "ip.addr"
        parts.append(f"({addr} == {host} && tcp.port == {port} && frame.time_epoch >= "
                     f"{min(times) - CONTEXT_BEFORE_S:.6f} && frame.time_epoch <= {max(times) + CONTEXT_AFTER_S:.6f})")
    return " || ".join(parts)


def _frames(path: str, display_filter: str) -> list[int]:
    proc = subprocess.run(["tshark", "-r", path, "-n", "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True, timeout=600)
    rows = [int(n) for n in proc.stdout.split() if n.isdigit()]
    if proc.returncode != 0 and not rows:
        raise SaveError(f"tshark cannot read {path}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return rows


def _records(path: str):
    """(linktype, iterator of (ts seconds, bytes)) of a pcap or pcapng file, in frame order."""
    import dpkt  # here, not at the top: 3.5 MB that every analyze and watch would carry for a key press
    from dpkt import pcapng

    fh = open(path, "rb")
    head = fh.read(4)
    fh.seek(0)
    reader = pcapng.Reader(fh) if is_pcapng(head) else dpkt.pcap.Reader(fh)

    def records():
        try:
            yield from reader
        except (dpkt.NeedData, dpkt.UnpackError, ValueError):
            return  # a capture still being written (the live spool) or cut short ends at its last whole record
        finally:
            fh.close()

    return reader.datalink(), records()


def _idb(name: str, linktype: int) -> pcapng.InterfaceDescriptionBlockLE:
    from dpkt import pcapng

    return pcapng.InterfaceDescriptionBlockLE(
        linktype=linktype, snaplen=262144,
        opts=[pcapng.PcapngOptionLE(code=pcapng.PCAPNG_OPT_IF_NAME, data=name.encode()),
              pcapng.PcapngOptionLE(code=pcapng.PCAPNG_OPT_ENDOFOPT)])


def save_evidence(f: Finding, sources: Mapping[str, str], path: str, overwrite: bool = False) -> Saved:
    """Write ``f``'s packets to ``path`` (pcapng). ``sources`` maps an evidence source (a file name, or
    ``pod/iface`` in a live watch) to the capture file that holds its bytes.

    Raises SaveError when ``path`` exists and ``overwrite`` is False, when no evidence source has a capture
    file, or when nothing could be read or written."""
    if os.path.exists(path) and not overwrite:
        raise SaveError(f"{path} exists; not overwritten")
    wanted = [s for s in dict.fromkeys(e.source for e in f.evidence if e.frame) if s in sources]
    if not wanted:
        raise SaveError("no capture file holds this finding's packets (a live watch keeps them only while it runs)")
    picked: list[tuple[float, int, bytes]] = []  # (ts, interface index, bytes)
    idbs: list[pcapng.InterfaceDescriptionBlockLE] = []
    frames: dict[str, list[int]] = {}
    iface_of = {e.source: e.iface for e in f.evidence if e.iface}
    for source in wanted:
        selected = set(_frames(sources[source], selection_filter(f, source)))
        if not selected:
            continue
        linktype, records = _records(sources[source])
        idbs.append(_idb(iface_of.get(source) or (f.connection.iface if f.connection else "") or "unknown", linktype))
        frames[source] = sorted(selected)
        last = max(selected)
        for n, (ts, buf) in enumerate(records, 1):
            if n in selected:
                picked.append((float(ts), len(idbs) - 1, bytes(buf)))
            if n >= last:
                break
    if not picked:
        raise SaveError("the capture files no longer hold this finding's packets")
    picked.sort(key=lambda p: p[0])
    from dpkt import pcapng

    tmp = f"{path}.part"
    try:
        if overwrite:
            replaceable(path)  # a link, a FIFO or another user's file there is not ours to replace
        # Owner-only, as --write-pcap's copies: the packets hold the traffic's headers unredacted (cookies,
        # tokens); a .part left by a run that died is ours to replace, a link planted there is not.
        with io.BufferedWriter(open_copy(tmp, replace=True)) as out:
            writer = pcapng.Writer(out, idb=idbs)
            for ts, iface, buf in picked:
                writer.writepkt(pcapng.EnhancedPacketBlockLE(iface_id=iface, caplen=len(buf), pkt_len=len(buf),
                                                             pkt_data=buf), ts=ts)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise SaveError(f"cannot write {e.filename or path}: {e.strerror}") from None
    return Saved(path, len(picked), frames)
