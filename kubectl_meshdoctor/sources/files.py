"""The files a user gives ``analyze``: the FILE[:IFACE], FILE:POD/IFACE arguments, what each file holds, told by
its content (a capture, an Envoy log, an admin dump), and a capture's interface when its name does not say it. How a capture is then read is sources/read_plan.py's."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from kubectl_meshdoctor.envoy.access_log import parse_line
from kubectl_meshdoctor.envoy.component_log import parse_component_stages
from kubectl_meshdoctor.envoy.log_format import LogFormat
from kubectl_meshdoctor.envoy.pasted_dump import CLUSTERS_TEXT_LINE, unpasted_lines
from kubectl_meshdoctor.envoy.stats_prometheus import looks_like_prometheus
from kubectl_meshdoctor.envoy.wrappers import unwrap, unwrap_layers
from kubectl_meshdoctor.pcap_header import is_capture
from kubectl_meshdoctor.sources.envoy_files import text_encoding
from kubectl_meshdoctor.sources.iface_role import FrameRoles, capture_role, frame_roles, is_mixed


class InputError(Exception):
    """An input file that cannot be read, or of no known kind; the message is one line for stderr."""


_IFACE = r"[A-Za-z0-9_.@-]{1,15}"  # a Linux interface name: at most IFNAMSIZ - 1 bytes
# A pod's name (a DNS-1123 subdomain, Kubernetes' rule for object names), or a directory's, as the user spells it.
_POD = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}"


@dataclass(frozen=True, slots=True)
class CaptureArg:
    """One input file from the command line: ``FILE``, ``FILE:IFACE``, ``FILE:POD/IFACE`` or ``FILE:POD/``.
    ``iface``: the one given (``explicit``: it applies to every packet of the file), else what the file's name
    says (``lo.pcap`` -> lo; ``named``), else its stem until ``with_role`` reads the capture's content. ``pod``:
    the pod the file belongs to (None: the one unnamed pod of a run that names none). A log of several pods'
    lines (kubectl --prefix, sources/log_pods.py) is read once a pod: ``line_pod``, only the lines that name
    that pod; ``except_pods``, every line but those naming one of these (they are read as their own pods')."""

    path: str
    iface: str
    explicit: bool = False  # the user named the interface: it applies to every packet of the file
    pod: str | None = None
    named: bool = True  # the interface is the user's or the file name's, not a guess from its stem
    line_pod: str | None = None
    except_pods: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, arg: str) -> "CaptureArg":
        """``arg`` as given. InputError (one line, teaching the right form) for ``FILE:WORD`` or
        ``FILE:POD/WORD`` where WORD is no interface name (``lo``, ``eth0``, ...): ``FILE:server`` meant as pod
        server must not become packets of an interface "server", which no detector reads."""
        if ":" in arg and not os.path.exists(arg):
            head, _, tail = arg.rpartition(":")
            m = re.fullmatch(f"(?:({_POD})/)?({_IFACE})?", tail)
            if head and m and (m.group(1) or m.group(2)):
                pod, iface = m.group(1), m.group(2)
                if iface and not _is_iface_word(iface):
                    pod_part = f"{pod}/" if pod else f"{iface}/"
                    raise InputError(f"{arg}: {iface!r} is no interface name (lo, eth0, ethN, any, vethX, enX); "
                                     f"for a file of pod {pod or iface} write {head}:{pod_part} (the interface "
                                     f"then from the file's name or content) or {head}:{pod_part}eth0")
                if iface:
                    return cls(head, iface, explicit=True, pod=pod)
                return cls(head, iface_from_name(head), pod=pod, named=names_iface(head))
        return cls(arg, iface_from_name(arg), named=names_iface(arg))

    def in_pod(self, pod: str) -> "CaptureArg":
        """This file as one of pod ``pod``'s."""
        return dataclasses.replace(self, pod=pod)

    def lines_of(self, pod: str) -> "CaptureArg":
        """This log as pod ``pod``'s: only its lines that name that pod."""
        return dataclasses.replace(self, pod=pod, line_pod=pod, except_pods=frozenset())


def _stem(path: str) -> str:
    return Path(path).name.split(".")[0] or "unknown"


def names_iface(path: str) -> bool:
    """Whether file ``path``'s name says its interface (``lo.pcap``, ``reviews-eth0.pcap``)."""
    return _is_iface_word(iface_from_name(path))


def _is_iface_word(word: str) -> bool:
    return re.fullmatch(r"lo|any|eth\d+|net\d+|en[a-z0-9]+|veth\w*", word) is not None


def iface_from_name(path: str) -> str:
    """The interface a file name suggests: ``lo.pcap`` -> lo, ``reviews-eth0.pcap`` -> eth0 (the names
    ``watch --write-pcap`` gives), otherwise the stem itself."""
    stem = _stem(path)
    last = re.split(r"[-_]", stem)[-1]
    return last if _is_iface_word(last) else stem


def with_role(a: CaptureArg) -> CaptureArg:
    """Capture ``a`` with the interface its content says (sources/iface_role.py: lo or eth0) when neither the
    user nor the file's name said one; as it is otherwise, or when the content does not tell."""
    if a.named:
        return a
    try:
        role = capture_role(_head(a.path))
    except InputError:
        return a  # unreadable: analyze says so when it reads it
    return a if role is None else CaptureArg(a.path, role, False, a.pod, named=False)


def mixed_roles(a: CaptureArg) -> FrameRoles | None:
    """Each frame's role (lo or eth0) of capture ``a`` when it holds both on interfaces that name none
    (mergecap of a pod's lo.pcap and eth0.pcap: sources/iface_role.py frame_roles), whatever the file is
    called; None when the user gave its interface (``:IFACE``), or its interfaces or packets say theirs, or it
    holds one role. Reads the file once more when it is mixed. Never raises: analyze names an unreadable file."""
    if a.explicit:
        return None
    try:
        if not is_mixed(_head(a.path)):
            return None
        with open(a.path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(a.path, "rb") if gz else open(a.path, "rb")) as fh:
            return frame_roles(fh)
    except (InputError, OSError, EOFError, zlib.error, struct.error):
        return None


# What a file given to analyze holds, told by its content (its name may say anything).
# ENVOY_LOG: an istio-proxy or Envoy log, its access-log lines, Envoy's own (component) lines, or both.
CAPTURE, ENVOY_LOG, STATS, CLUSTERS = "capture", "envoy-log", "stats", "clusters"
SNIFF_BYTES = 1 << 20  # an istio-proxy log starts with pilot-agent's lines; its first access-log line is near
# Lines of pilot-agent or Envoy itself (`2026-12-01T10:00:00.1Z\tinfo\t...`, `[2026-12-01 10:00:00.1][15][info]`):
# an istio-proxy container log, even one with no access-log line in its head.
_PROXY_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S*\s+(info|warn|warning|error|debug|trace)\s"
                             r"|\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+\]\[\d+\]\[\w+\])")
# A line of Envoy's text /stats: a dotted stat name, then a counter or gauge, a text readout or a histogram.
_STAT_NAME = re.compile(r'[^\s"{}<>\[\]]+')
_STAT_VALUE = re.compile(r'\d+$|"|P0\(|No recorded values')


def _stats_line(line: str) -> bool:
    """Whether ``line`` reads as one of Envoy's text /stats: a dotted stat name, ": ", then a counter or gauge, a
    text readout or a histogram. Split at the first ": " rather than matched whole: a regex that must find the
    dot in a line of megabytes with no ": " backtracks over every split of it."""
    name, sep, value = line.partition(": ")
    return bool(sep) and "." in name and _STAT_NAME.fullmatch(name) is not None and _STAT_VALUE.match(value) is not None
# What only Envoy's own stats start with (a dump filtered with ?filter= still has one): `Name: value` text of
# another program's (/proc/net/snmp, a mail header, YAML) is no dump.
_ENVOY_STAT_ROOT = re.compile(r"^(?:cluster|cluster_manager|listener|listener_manager|http|server|runtime|"
                              r"tcp|vhost|control_plane|sds|tls_inspector|workers|overload|main_thread|"
                              r"filesystem|istio|istiocustom|wasm|envoy|http1|http2|dns_cache|udp)\.")


def _regular(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):
        # Reading the magic from a pipe would take those bytes from tshark, which then finds nothing.
        raise InputError(f"{path}: not a regular file (a pipe or device); save it to a file first")


def _gunzip_head(path: str) -> bytes:
    """The first SNIFF_BYTES that decompress from gzip file ``path``: all there is of one cut short or with a
    wrong checksum (its lines are read up to there: sources/envoy_files.py), an error only when none does. The
    file's last 8 bytes, a member's trailer (CRC-32 and size, RFC 1952 section 2.2), are not fed: a wrong
    checksum then costs nothing of what came before it."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the gzip container
    out = b""
    with open(path, "rb") as fh:
        chunk = fh.read(1 << 16)
        while chunk and len(out) < SNIFF_BYTES:
            following = fh.read(1 << 16)
            data = chunk if following else chunk[:-8]
            try:
                out += inflate.decompress(inflate.unconsumed_tail + data, SNIFF_BYTES - len(out))
            except zlib.error:
                if out:
                    break
                raise
            if inflate.eof:
                break
            chunk = following
    return out


def _head(path: str) -> bytes:
    """The first SNIFF_BYTES of ``path``, decompressed when it is gzip (tshark reads gzipped captures)."""
    _regular(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = _gunzip_head(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:  # zlib: a .gz whose data is not deflate
        raise InputError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return head


def input_kind(path: str, log_format: LogFormat | None = None) -> str:
    """What ``path`` holds, by its content: CAPTURE (pcap or pcapng, also gzipped), ENVOY_LOG (an Envoy
    access log in any format Istio or Envoy shipped, or ``log_format``, TEXT or JSON; Envoy's own component
    log in any of its shapes; or an istio-proxy container log holding either; wrapped or not: `kubectl logs
    --timestamps/--prefix`, stern, CRI or Docker log files, grep output; envoy/wrappers.py), STATS (admin
    `/stats` text) or CLUSTERS (admin `/clusters`, text or JSON). Raises InputError (one line) when it cannot
    be read or is none of them."""
    head = _head(path)
    if is_capture(head):
        return CAPTURE
    text = head.decode(text_encoding(head), errors="replace")
    lines = text.splitlines()
    if len(head) == SNIFF_BYTES and lines:
        lines = lines[:-1]  # cut at SNIFF_BYTES: the last line may be a piece
    lines = [line for line in lines if line.strip()]
    if any(parse_line(line, log_format) is not None
           or parse_component_stages(u.text for u in reversed(unwrap_layers(line))) is not None for line in lines):
        return ENVOY_LOG
    if any(parse_line(line, log_format) is not None for line in _pretty_objects(lines)):
        return ENVOY_LOG
    # A dump pasted into a ticket comes in a code block, after a line of prose or the command that made it.
    dump = unpasted_lines(lines)
    first = dump[0] if dump else ""
    if first.startswith("{") and '"cluster_statuses"' in text:
        return CLUSTERS
    if first.startswith("{") and '"stats"' in text and '"name"' in text:
        raise InputError(f"{path}: a /stats dump in JSON, which analyze does not read; save /stats as text "
                         f"(curl localhost:15000/stats, or kubectl exec POD -c istio-proxy -- pilot-agent "
                         f"request GET stats)")
    if CLUSTERS_TEXT_LINE.match(first):
        return CLUSTERS
    if _stats_line(first) and sum(map(_stats_line, dump)) > len(dump) // 2 \
            and any(_ENVOY_STAT_ROOT.match(line) for line in dump):
        return STATS
    if looks_like_prometheus(lines) or looks_like_prometheus(dump):
        return STATS  # /stats/prometheus, a scrape of :15090
    if any(_PROXY_LOG_LINE.match(unwrap(line).text) for line in lines[:50]):
        return ENVOY_LOG
    raise InputError(f"{path}: not a capture (pcap, pcapng), an Envoy log or an admin dump (/stats, /clusters); "
                     f"an access log of the mesh's own format reads with --log-format")


def _pretty_objects(lines: list[str]) -> list[str]:
    """The JSON objects `jq` printed over several lines (``{`` alone to ``}``), each joined into one line: a
    JSON access log in a ticket often comes so (sources/envoy_files.py joins them the same way)."""
    out, held = [], []
    for line in lines:
        text = unwrap(line).text.strip()
        if text == "{" and not held:
            held = [text]
        elif held:
            held.append(text)
            if text.startswith("}") or len(held) > 300:
                out.append(" ".join(held).rstrip(","))
                held = []
    return out



def content_digest(path: str) -> str:
    """A digest of ``path``'s bytes: two files with the same one hold the same frames or lines."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
