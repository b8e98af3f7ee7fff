from kubectl_meshdoctor.sources.kernel import counter_deltas, parse_counters

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
