"""PacketEvent's and HttpStart's own __init__ (core/events.py: built once a packet, a message start; they store
through the slots) against what a frozen dataclass of the same fields would be."""

import dataclasses
import inspect
import pickle

import pytest

from kubectl_meshdoctor.core.events import HttpStart, PacketEvent, TcpFlags, TlsStart

_VALUES = dict(ts=1_764_439_363.25, iface="eth0", source="a.pcap", frame=7, src="198.18.0.1", sport=40_000,
               dst="198.18.0.2", dport=8080, flags=TcpFlags.PSH | TcpFlags.ACK, seq=11, ack=22, payload_len=33,
               http=HttpStart("GET / HTTP/1.1", (("Host", "x"),)), tls=TlsStart(22, 0x0303, 512, 1, "x"))


@pytest.mark.parametrize("cls", [PacketEvent, HttpStart])
def test_its_parameters_are_the_dataclass_fields_in_order_with_their_defaults(cls):
    params = inspect.signature(cls).parameters
    assert list(params) == [f.name for f in dataclasses.fields(cls)]
    for f in dataclasses.fields(cls):
        default = params[f.name].default
        assert default == (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default), f.name


def test_an_http_start_holds_what_it_was_given():
    given = dict(start_line="GET / HTTP/1.1", headers=(("Host", "x"),), raw_header_lines=(" folded",),
                 complete=False, raw_owners=("Host",))
    for start in (HttpStart(**given), HttpStart(*given.values())):
        assert {f.name: getattr(start, f.name) for f in dataclasses.fields(start)} == given
    assert HttpStart("HTTP/1.1 200 OK") == HttpStart("HTTP/1.1 200 OK", (), (), True, ())


@pytest.mark.parametrize("by_name", [False, True])
def test_each_field_holds_what_it_was_given(by_name):
    ev = PacketEvent(**_VALUES) if by_name else PacketEvent(*_VALUES.values())
    assert {f.name: getattr(ev, f.name) for f in dataclasses.fields(ev)} == _VALUES
    assert ev == PacketEvent(*_VALUES.values()) and hash(ev) == hash(PacketEvent(**_VALUES))
    assert pickle.loads(pickle.dumps(ev)) == ev
    assert dataclasses.replace(ev, iface="lo").iface == "lo"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.ts = 0.0  # still frozen
