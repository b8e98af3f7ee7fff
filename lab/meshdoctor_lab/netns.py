"""Network namespaces, veths and Istio's nat rules for lab pods.

Each lab pod is two namespaces joined by a veth: `<prefix>-<pod>` (the pod: lo + eth0 with the rules
istio-init installs) and `<prefix>-<pod>-c` (its downstream clients). Every command runs through `ip`,
`iptables-restore` or `sysctl`; failures raise LabError with one line.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from meshdoctor_lab.state import LabError

# iptables-restore input of istio-init for the default injection template (Istio >= 1.25, REDIRECT mode,
# `istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i * -x "" -b * -d 15090,15021,15020`), composed from
# istio/istio tools/istio-iptables/pkg/capture/run.go and its testdata/*.golden for these arguments. Every
# inbound TCP port except 15008/15090/15021/15020 is REDIRECTed to 15006, so 5000 and 5002 share one listener:
# the root of the four-tuple collision.
ISTIO_NAT_RULES = """\
* nat
-N ISTIO_INBOUND
-N ISTIO_REDIRECT
-N ISTIO_IN_REDIRECT
-N ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
COMMIT
"""

# What istio-init adds when its INVALID_DROP is true (proxyMetadata INVALID_DROP: "true"), before its nat rules:
# istio/istio tools/istio-iptables/pkg/capture/run.go (DropInvalid) and testdata/drop-invalid.golden.
ISTIO_DROP_INVALID_RULES = """\
* mangle
-N ISTIO_DROP
-A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP
-A ISTIO_DROP -j DROP
COMMIT
"""

# The same for `sidecar.istio.io/interceptionMode: TPROXY` (`istio-iptables ... -m TPROXY`): istio/istio's golden
# testdata/inbound-ports-wildcard-tproxy.golden, plus the -d exclusions run.go writes into the inbound table
# (mangle here) before the conntrack rule, and the outbound catch-all a real pod's `-i *` adds (in the nat part,
# below). An inbound SYN is TPROXYed to Envoy's transparent listener on 15006 without rewriting its
# destination, so the accepted socket keeps the port the client dialled (its own four-tuple); Envoy's upstream
# leg keeps the client's address (original_src, mark 1337) and the app's replies are routed back to it by the
# connmark and table 133.
ISTIO_TPROXY_RULES = """\
* mangle
-N ISTIO_DIVERT
-N ISTIO_TPROXY
-N ISTIO_INBOUND
-A ISTIO_DIVERT -j MARK --set-mark 1337
-A ISTIO_DIVERT -j ACCEPT
-A ISTIO_TPROXY ! -d 127.0.0.1/32 -p tcp -j TPROXY --tproxy-mark 1337/0xffffffff --on-port 15006
-A PREROUTING -p tcp -j ISTIO_INBOUND
{excluded}-A ISTIO_INBOUND -p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT
-A ISTIO_INBOUND -p tcp -j ISTIO_TPROXY
-A PREROUTING -p tcp -m mark --mark 1337 -j CONNMARK --save-mark
-A OUTPUT -p tcp -o lo -m mark --mark 1337 -j RETURN
-A OUTPUT ! -d 127.0.0.1/32 -p tcp -o lo -m owner --uid-owner 1337 -j MARK --set-mark 1338
-A OUTPUT ! -d 127.0.0.1/32 -p tcp -o lo -m owner --gid-owner 1337 -j MARK --set-mark 1338
-A OUTPUT -p tcp -m connmark --mark 1337 -j CONNMARK --restore-mark
-I ISTIO_INBOUND 1 -p tcp -m mark --mark 1337 -j RETURN
-I ISTIO_INBOUND 2 -p tcp -s 127.0.0.6/32 -i lo -j RETURN
-I ISTIO_INBOUND 3 -p tcp -i lo -m mark ! --mark 1338 -j RETURN
COMMIT
"""
# Its nat table is REDIRECT's without the inbound redirect: no PREROUTING jump, and ISTIO_INBOUND keeps only its
# tunnel-port RETURN (the golden's nat section); the outbound rules are the same.
ISTIO_TPROXY_RULES += "".join(line for line in ISTIO_NAT_RULES.splitlines(keepends=True)
                              if not line.startswith(("-A PREROUTING", "-A ISTIO_INBOUND")) or "15008" in line)
TPROXY_MARK = 1337  # istio-iptables -t (INBOUND_TPROXY_MARK)
TPROXY_ROUTE_TABLE = 133  # istio-iptables -r (INBOUND_TPROXY_ROUTE_TABLE)
ISTIO_DEFAULT_EXCLUDED = (15090, 15021, 15020)  # the injection template's -d (15020: the status port)

INBOUND_CAPTURE_PORT = 15006  # Envoy's virtualInbound, ISTIO_IN_REDIRECT's target
INBOUND_PASSTHROUGH_SOURCE = "127.0.0.6"  # Envoy's InboundPassthroughBindIpv4; RETURNed by ISTIO_OUTPUT

# Only benchmarking addresses (RFC 2544), never routable, so a lab cannot shadow a real network.
LAB_NETWORK = ipaddress.ip_network("198.18.0.0/15")

# Kernel-chosen (ephemeral) client ports stay below this, so a scenario that binds an explicit port from
# CLIENT_FIXED_PORTS never races the kernel for it.
CLIENT_EPHEMERAL_PORTS = (32768, 39999)
CLIENT_FIXED_PORTS = (40000, 60999)

DEFAULT_LAB_NAME = "meshdoctor-lab"
SHORT_NAME_PREFIX = 12  # letters and digits: a lab name this short is its namespaces' prefix
_NETNS_DIR = Path("/run/netns")
_TOOLS = ("ip", "iptables-restore", "conntrack", "sysctl")


def netns_prefix(lab_name: str) -> str:
    """A short namespace prefix for a lab: `mdlab` for the default lab; the name itself when it is at most
    SHORT_NAME_PREFIX letters and digits (no `-`, so `PREFIX-POD` still splits at its first `-`); else `md` + 6 hex
    digits of its hash.

    Derived from the name so two labs with different names coexist without sharing a namespace, and a lab named
    for whoever runs it (`ip netns list`) shows whose namespaces these are.
    """
    if lab_name == DEFAULT_LAB_NAME:
        return "mdlab"
    if re.fullmatch(rf"[a-z0-9]{{1,{SHORT_NAME_PREFIX}}}", lab_name):
        return lab_name
    return "md" + hashlib.sha256(lab_name.encode()).hexdigest()[:6]


def pod_addresses(index: int) -> tuple[str, str]:
    """(client_ip, pod_ip) of pod number `index` (1-based): 198.18.<index>.1 and 198.18.<index>.2.

    Raises LabError when the index leaves 198.18.0.0/15's third octet range.
    """
    if not 1 <= index <= 254:
        raise LabError(f"lab pod number {index} is out of range 1-254")
    return f"198.18.{index}.1", f"198.18.{index}.2"


def missing_tools() -> list[str]:
    """Names of the commands the lab needs that are not on PATH."""
    return [tool for tool in _TOOLS if shutil.which(tool) is None]


def run(args: Sequence[str], *, input_text: str | None = None, timeout: float = 20.0) -> str:
    """Run a command and return its stdout; raise LabError with the command and its first error line."""
    try:
        done = subprocess.run(
            list(args), input=input_text, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(args)}: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[0]
        raise LabError(f"{' '.join(args)}: {detail}")
    return done.stdout


def in_netns(netns: str, *args: str) -> list[str]:
    """The argv that runs `args` inside `netns`."""
    return ["ip", "netns", "exec", netns, *args]


def netns_exists(netns: str) -> bool:
    return (_NETNS_DIR / netns).exists()


def create_pod_network(netns: str, client_netns: str, pod_ip: str, client_ip: str,
                       local_ports: tuple[int, int] | None = None, interception: str = "REDIRECT",
                       excluded_ports: Sequence[int] = (), drop_invalid: bool = False,
                       conntrack_be_liberal: bool = False) -> None:
    """Create the pod and client namespaces, the eth0 veth pair, addresses, and Istio's rules for
    ``interception`` with ``excluded_ports`` out of inbound capture (istio_rules; none for NONE, a pod without a
    sidecar), with ISTIO_DROP_INVALID_RULES first when ``drop_invalid``; ``local_ports`` narrows the
    pod namespace's ip_local_port_range (the ports its sidecar dials the app from); ``conntrack_be_liberal`` sets
    its net.netfilter.nf_conntrack_tcp_be_liberal to 1.

    Raises LabError (leaving whatever was created for delete_netns to remove) when a step fails.
    """
    for ns in (netns, client_netns):
        if netns_exists(ns):
            raise LabError(f"network namespace {ns} already exists (another lab? run `lab down` first)")
        run(["ip", "netns", "add", ns])
    # Both ends are called eth0: inside its namespace each is the only interface besides lo.
    run(["ip", "link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", "eth0", "netns", client_netns])
    for ns, ip in ((netns, pod_ip), (client_netns, client_ip)):
        run(in_netns(ns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0"))
        run(in_netns(ns, "ip", "link", "set", "lo", "up"))
        run(in_netns(ns, "ip", "link", "set", "eth0", "up"))
    lo, hi = CLIENT_EPHEMERAL_PORTS
    run(in_netns(client_netns, "sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={lo} {hi}"))
    if local_ports is not None:
        run(in_netns(netns, "sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={local_ports[0]} {local_ports[1]}"))
    if conntrack_be_liberal:
        run(in_netns(netns, "sysctl", "-q", "-w", "net.netfilter.nf_conntrack_tcp_be_liberal=1"))
    if interception == "NONE":  # a pod without a sidecar: no istio-init, so no rules
        return
    run(in_netns(netns, "iptables-restore"), input_text=istio_rules(interception, excluded_ports))
    if drop_invalid:  # --noflush: TPROXY's rules have a mangle table of their own
        run(in_netns(netns, "iptables-restore", "--noflush"), input_text=ISTIO_DROP_INVALID_RULES)
    if interception == "TPROXY":  # istio-iptables' policy routing: marked packets are delivered locally
        run(in_netns(netns, "ip", "-f", "inet", "rule", "add", "fwmark", str(TPROXY_MARK), "lookup",
                     str(TPROXY_ROUTE_TABLE)))
        run(in_netns(netns, "ip", "-f", "inet", "route", "add", "local", "default", "dev", "lo", "table",
                     str(TPROXY_ROUTE_TABLE)))


def istio_rules(interception: str = "REDIRECT", excluded_ports: Sequence[int] = ()) -> str:
    """The iptables-restore input istio-init writes for ``interception`` (REDIRECT or TPROXY) with
    ``excluded_ports`` added to the template's -d list (``traffic.sidecar.istio.io/excludeInboundPorts``).

    Raises LabError for another mode (NONE has no istio-init)."""
    if interception == "REDIRECT":
        extra = "".join(f"-A ISTIO_INBOUND -p tcp --dport {p} -j RETURN\n" for p in excluded_ports)
        marker = "-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN\n"  # the injector appends the status port last
        return ISTIO_NAT_RULES.replace(marker, extra + marker)
    if interception == "TPROXY":
        ports = (*ISTIO_DEFAULT_EXCLUDED[:2], *excluded_ports, ISTIO_DEFAULT_EXCLUDED[2])
        return ISTIO_TPROXY_RULES.format(excluded="".join(f"-A ISTIO_INBOUND -p tcp --dport {p} -j RETURN\n"
                                                          for p in ports))
    raise LabError(f"interception mode {interception!r}: the lab captures with REDIRECT or TPROXY")


def istio_outbound_rules() -> str:
    """istio-init's REDIRECT rules without the inbound capture (no PREROUTING jump): for a caller's namespace, whose
    sidecar renders only the outbound side. Its own connections (uid 1337) and those to 127.0.0.1 RETURN; every
    other TCP connection it makes goes to 15001."""
    return "".join(line for line in ISTIO_NAT_RULES.splitlines(keepends=True)
                   if not line.startswith("-A PREROUTING"))


def install_caller_rules(client_netns: str) -> None:
    """Install istio_outbound_rules in ``client_netns``. Raises LabError."""
    run(in_netns(client_netns, "iptables-restore"), input_text=istio_outbound_rules())


def netns_pids(netns: str) -> list[int]:
    """Pids of the processes whose network namespace is `netns` (empty when it does not exist)."""
    if not netns_exists(netns):
        return []
    try:
        out = run(["ip", "netns", "pids", netns])
    except LabError:
        return []
    return [int(tok) for tok in out.split()]


def delete_netns(netns: str) -> None:
    """Delete a namespace (its veth end goes with it, and with it the peer); no error when already gone."""
    if netns_exists(netns):
        run(["ip", "netns", "delete", netns])


def listening_ports(netns: str) -> set[int]:
    """TCP ports with a listening socket in `netns`; empty when `ss` fails (e.g. the namespace is gone)."""
    try:
        out = run(in_netns(netns, "ss", "-Hltn"))
    except LabError:
        return set()
    ports: set[int] = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            ports.add(int(fields[3].rsplit(":", 1)[1]))
    return ports
