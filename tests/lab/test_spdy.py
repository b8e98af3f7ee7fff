"""The SPDY/3.1 framer and server session of the lab API server, against themselves (the lab tests in
tests/lab/test_kubectl.py hold them against the real kubectl), and the protobuf review reader."""

from __future__ import annotations

import asyncio
import hashlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshdoctor_lab.apiserver import k8sproto, spdy
from meshdoctor_lab.apiserver.httpstream import SpdySession
from meshdoctor_lab.apiserver.pfspdy import validate

from ..waiting import wait_until_async

FRAMES: list[spdy.Frame] = [
    spdy.SynStream(1, (("streamtype", "error"), ("port", "8080"), ("requestid", "0")), priority=3),
    spdy.SynStream(3, (("streamtype", "data"), ("a", "1"), ("a", "2")), fin=True, unidirectional=True),
    spdy.SynReply(1),
    spdy.SynReply(3, (("x-stream-protocol-version", "v4.channel.k8s.io"),), fin=True),
    spdy.Data(1, b"\x00\xff" * 1000),
    spdy.Data(3, b"", fin=True),
    spdy.RstStream(5, spdy.CANCEL),
    spdy.Settings(((0, 4, 100), (1, 7, 65536)), clear=True),
    spdy.Ping(7),
    spdy.GoAway(5, 0),
    spdy.HeadersFrame(1, (("k", "v"),), fin=True),
    spdy.WindowUpdate(0, 1 << 20),
]


def test_dictionary_is_the_spdy3_one() -> None:
    # draft-mbelshe-httpbis-spdy-00 2.6.10.1: 1423 bytes; the digest is of the spec's byte array.
    assert len(spdy.DICTIONARY) == 1423
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert b"\x00\x00\x00\x06200 OK\x00\x00\x00\x07version" in spdy.DICTIONARY
    assert spdy.DICTIONARY.endswith(b",utf-,*,enq=0.")
    assert hashlib.sha256(spdy.DICTIONARY).hexdigest() == \
        "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"


def test_every_frame_round_trips_in_any_pieces() -> None:
    sender = spdy.Framer()
    wire = b"".join(sender.encode(f) for f in FRAMES)
    for step in (1, 3, 7, 64, len(wire)):
        receiver = spdy.Framer()
        got: list[spdy.Frame] = []
        for i in range(0, len(wire), step):
            got += receiver.feed(wire[i:i + step])
        assert got == FRAMES


def test_fixed_layouts_of_control_and_data_frames() -> None:
    f = spdy.Framer()
    # 2.2.1: control bit, version 3, type; 2.6.5 PING: 4-byte id.
    assert f.encode(spdy.Ping(1)) == bytes.fromhex("80030006 00000004 00000001")
    # 2.6.3 RST_STREAM: stream id, status.
    assert f.encode(spdy.RstStream(3, spdy.CANCEL)) == bytes.fromhex("80030003 00000008 00000003 00000005")
    # 2.6.6 GOAWAY: last good stream id, status.
    assert f.encode(spdy.GoAway(9, 2)) == bytes.fromhex("80030007 00000008 00000009 00000002")
    # 2.2.2 data frame: no control bit, flags (FIN) and 24-bit length.
    assert f.encode(spdy.Data(5, b"hi", fin=True)) == bytes.fromhex("00000005 01000002 6869")


def test_header_blocks_share_one_zlib_stream_primed_with_the_dictionary() -> None:
    f = spdy.Framer()
    first = f.encode(spdy.SynReply(1, (("streamtype", "stdout"),)))
    second = f.encode(spdy.SynReply(3, (("streamtype", "stdout"),)))
    assert len(second) < len(first)  # the second block refers back into the first: one stream per direction
    # A plain zlib inflater with the dictionary reads both blocks in order (what Go's spdystream does).
    inflate = zlib.decompressobj(zdict=spdy.DICTIONARY)
    blocks = [inflate.decompress(raw[12:]) for raw in (first, second)]
    expected = struct.pack(">I", 1) + struct.pack(">I", 10) + b"streamtype" + struct.pack(">I", 6) + b"stdout"
    assert blocks == [expected, expected]


def test_bad_bytes_are_refused() -> None:
    with pytest.raises(spdy.SpdyError, match="version 2"):
        spdy.Framer().feed(bytes.fromhex("80020006 00000004 00000001"))
    with pytest.raises(spdy.SpdyError, match="too short"):
        spdy.Framer().feed(bytes.fromhex("80030006 00000002 0000"))
    with pytest.raises(spdy.SpdyError, match="does not inflate"):
        spdy.Framer().feed(bytes.fromhex("80030002 00000008 00000001 deadbeef"))
    with pytest.raises(spdy.SpdyError, match="too long"):
        spdy.Framer().encode(spdy.Data(1, b"x" * (spdy.MAX_DATA_LENGTH + 1)))


def test_unknown_control_frames_are_skipped() -> None:
    # 2.2.1: a receiver ignores control frames of a type it does not know.
    unknown = bytes.fromhex("800300ff 00000002 abcd")
    assert spdy.Framer().feed(unknown + spdy.Framer().encode(spdy.Ping(3))) == [spdy.Ping(3)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["streamtype", "port", "requestid", "x"]),
                          st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)), max_size=6),
       st.binary(max_size=3000))
def test_headers_and_data_round_trip(headers: list[tuple[str, str]], data: bytes) -> None:
    sender, receiver = spdy.Framer(), spdy.Framer()
    frames = [spdy.SynStream(1, tuple(headers)), spdy.Data(1, data, fin=True)]
    got = receiver.feed(b"".join(sender.encode(f) for f in frames))
    grouped = [(k, v) for k in dict.fromkeys(k for k, _ in headers) for kk, v in headers if kk == k]
    assert got == [spdy.SynStream(1, tuple(grouped)), frames[1]]


# ------------------------------------------------------------------------------------------------ session


class _Client:
    """The client side of a session under test: encodes frames for it, decodes what it wrote."""

    def __init__(self) -> None:
        self.framer, self.reader = spdy.Framer(), spdy.Framer()
        self.received: list[spdy.Frame] = []
        self.paused: list[bool] = []

    async def write(self, data: bytes) -> None:
        self.received += self.reader.feed(data)

    def frames(self, *frames: spdy.Frame) -> bytes:
        return b"".join(self.framer.encode(f) for f in frames)


async def test_session_answers_streams_carries_data_and_closes_like_spdystream() -> None:
    client = _Client()
    session = SpdySession(client.write, client.paused.append, validate)
    session.feed(client.frames(
        spdy.SynStream(1, (("streamtype", "error"), ("port", "80"), ("requestid", "0")), fin=True),
        spdy.SynStream(3, (("streamtype", "data"), ("port", "80"), ("requestid", "0"))),
        spdy.SynStream(5, (("streamtype", "data"),)),  # no port: refused
        spdy.Data(3, b"hello"), spdy.Data(3, b"", fin=True), spdy.Ping(1), spdy.Ping(2)))
    error = await asyncio.wait_for(session.accept(), 5)
    data = await asyncio.wait_for(session.accept(), 5)
    assert error is not None and data is not None
    assert (error.header("streamtype"), data.header("StreamType")) == ("error", "data")
    assert await error.read() == b""  # FIN on SYN_STREAM: the client sends nothing on it
    assert await data.read() == b"hello" and await data.read() == b""
    await data.write(b"x" * 70_000)
    await data.close()
    await session.close()
    assert await session.accept() is None
    kinds = [(type(f).__name__, getattr(f, "stream_id", None)) for f in client.received]
    assert ("RstStream", 5) in kinds  # the refused one
    assert [f for f in client.received if isinstance(f, spdy.Ping)] == [spdy.Ping(1)]  # only odd pings echo
    replies = [f.stream_id for f in client.received if isinstance(f, spdy.SynReply)]
    assert replies == [1, 3]
    sent = b"".join(f.data for f in client.received if isinstance(f, spdy.Data) and f.stream_id == 3)
    assert sent == b"x" * 70_000
    assert max(len(f.data) for f in client.received if isinstance(f, spdy.Data)) <= 32 * 1024
    assert isinstance(client.received[-1], spdy.GoAway) and client.received[-1].last_good_id == 5


async def test_session_stops_reading_while_too_much_waits_unread() -> None:
    client = _Client()
    session = SpdySession(client.write, client.paused.append)
    session.feed(client.frames(spdy.SynStream(1, (("streamtype", "stdin"),))))
    stream = await asyncio.wait_for(session.accept(), 5)
    assert stream is not None
    session.feed(client.frames(*[spdy.Data(1, b"z" * 65536) for _ in range(20)]))
    assert client.paused == [True]
    got = 0
    while got < 20 * 65536:
        got += len(await stream.read())
    assert client.paused == [True, False]


async def test_session_refuses_even_or_decreasing_stream_ids() -> None:
    client = _Client()
    session = SpdySession(client.write, client.paused.append)
    session.feed(client.frames(spdy.SynStream(3), spdy.SynStream(1), spdy.SynStream(4)))
    assert await asyncio.wait_for(session.accept(), 5) is not None

    def resets() -> list:
        return [(f.stream_id, f.status) for f in client.received if isinstance(f, spdy.RstStream)]

    # the resets go out from the session's own task
    await wait_until_async("two resets sent", 5, resets, ok=lambda sent: len(sent) >= 2)
    assert resets() == [(1, spdy.PROTOCOL_ERROR), (4, spdy.PROTOCOL_ERROR)]


# ------------------------------------------------------------------------------------------------ protobuf

# kubectl 1.33's `auth can-i create pods --subresource=exec -n kchelper` request body, as its -v=9 printed it.
KUBECTL_133_SSAR = bytes.fromhex("".join("""
6b 38 73 00 0a 32 0a 17  61 75 74 68 6f 72 69 7a
61 74 69 6f 6e 2e 6b 38  73 2e 69 6f 2f 76 31 12
17 53 65 6c 66 53 75 62  6a 65 63 74 41 63 63 65
73 73 52 65 76 69 65 77  12 44 0a 10 0a 00 12 00
1a 00 22 00 2a 00 32 00  38 00 42 00 12 26 0a 24
0a 08 6b 63 68 65 6c 70  65 72 12 06 63 72 65 61
74 65 1a 00 22 00 2a 04  70 6f 64 73 32 04 65 78
65 63 3a 00 1a 08 08 00  12 00 1a 00 20 00 1a 00
22 00""".split()))


def test_protobuf_access_review_as_kubectl_sends_it() -> None:
    review = k8sproto.decode_review(KUBECTL_133_SSAR)
    assert review == {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                      "spec": {"resourceAttributes": {"namespace": "kchelper", "verb": "create", "resource": "pods",
                                                      "subresource": "exec"}}}


def test_protobuf_that_is_not_a_review_is_refused() -> None:
    with pytest.raises(k8sproto.ProtoError):
        k8sproto.decode_review(b'{"kind": "SelfSubjectAccessReview"}')
    with pytest.raises(k8sproto.ProtoError):
        k8sproto.decode_review(b"k8s\x00\x0a\x05\x12\x03Pod")
