from kubectl_meshdoctor.live.kernel import counter_deltas, parse_counters

SAMPLE = """TcpExt: SyncookiesSent TCPChallengeACK ListenDrops
TcpExt: 0 3 1
Tcp: RtoAlgorithm AttemptFails EstabResets
Tcp: 1 4 2
#conntrack
entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop
00000000  00000000 000001fe 00000000 00000000 00000000 00000000 00000000 00000000 00000002 00000001 00000000
00000000  00000000 00000160 00000000 00000000 00000000 00000000 00000000 00000000 0000000a 00000000 00000000
"""


def test_nstat_names_and_conntrack_sums():
    c = parse_counters(SAMPLE)
    assert c["TcpExtTCPChallengeACK"] == 3 and c["TcpAttemptFails"] == 4
    assert c["ConntrackInsertFailed"] == 12 and c["ConntrackDrop"] == 1


def test_deltas_only_for_watched_counters_that_moved():
    before = parse_counters(SAMPLE)
    after = dict(before, TcpExtTCPChallengeACK=5, TcpExtSyncookiesSent=9)
    assert counter_deltas(before, after) == {"TcpExtTCPChallengeACK": 2}


# /proc/net/tcp and tcp6 as Linux prints them (Documentation/networking/proc_net_tcp.rst): the lab's
# refused-localhost pod, whose app listens on 127.0.0.1:5000 only, beside Envoy on 15006 and an app on :5002.
PROC_NET_TCP = """#tcp
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1388 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0
   1: 00000000:3A9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 41235 1 0
   2: 0201A8C6:1388 0101A8C6:9C40 01 00000000:00000000 00:00000000 00000000     0        0 41236 1 0
  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000000000000:138A 00000000000000000000000000000000:0000 0A 00000000:00000000
   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000
"""


def test_listening_sockets_are_read_in_the_kernel_s_byte_order():
    from kubectl_meshdoctor.live.kernel import parse_listeners

    assert parse_listeners(PROC_NET_TCP) == {("127.0.0.1", 5000), ("0.0.0.0", 15006), ("::", 5002), ("::1", 8080)}
    assert parse_listeners("no tcp part") == frozenset()
    assert parse_counters("TcpExt: TCPChallengeACK\nTcpExt: 3\n" + PROC_NET_TCP) == {"TcpExtTCPChallengeACK": 3}
