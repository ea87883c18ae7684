"""The transcript index: every query answers exactly what a full scan answers, touching only candidates."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from privaudit.transcript import Message, Transcript, load, save

PARTIES = ["server", "item-server"] + [f"client:{k}" for k in range(5)]
KINDS = ["grad_V", "grad_P", "state", "private", "model"]


def _random_transcript(seed: int, n: int = 400) -> Transcript:
    rng = np.random.default_rng(seed)
    t = Transcript("p", parties=list(PARTIES))
    for _ in range(n):
        kind = KINDS[rng.integers(len(KINDS))]
        sender = PARTIES[rng.integers(len(PARTIES))]
        own = kind in ("private", "state") and rng.random() < 0.8
        receiver = sender if own else PARTIES[rng.integers(len(PARTIES))]
        t.add(int(rng.integers(4)), sender, receiver, kind, {"x": rng.normal(size=2)})
    return t


def _scan(messages, kind=None, sender=None, receiver=None, round=None):
    return [
        m.seq
        for m in messages
        if (kind is None or m.kind == kind)
        and (sender is None or m.sender == sender)
        and (receiver is None or m.receiver == receiver)
        and (round is None or m.round == round)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_query_equals_a_full_scan(seed):
    t = _random_transcript(seed)
    for kind in KINDS + [None, "absent"]:
        for sender in PARTIES[:4] + [None]:
            for receiver in PARTIES[:4] + [None]:
                for rnd in (None, 1):
                    got = [m.seq for m in t.select(kind, sender=sender, receiver=receiver, round=rnd)]
                    assert got == _scan(t.messages, kind, sender, receiver, rnd)
    for party in PARTIES:
        view = t.view(party)
        assert [m.seq for m in view.messages] == _scan(t.messages, receiver=party)
        assert [m.seq for m in view.select("grad_V", sender="client:1")] == _scan(
            t.messages, "grad_V", "client:1", party
        )
        expected: dict = {}
        for m in t.messages:
            if m.kind == "private" and m.sender == party == m.receiver:
                expected.update(m.payload)
        got = t.private(party)
        assert got.keys() == expected.keys() and all(got[k] is expected[k] for k in got)
    assert dict(t.kinds()) == {k: len(_scan(t.messages, k)) for k in KINDS if _scan(t.messages, k)}
    assert t.rounds("state") == sorted({m.round for m in t.messages if m.kind == "state"})
    assert [m.seq for m in t.without_private().messages] == [m.seq for m in t.messages if m.kind != "private"]


def test_add_after_a_query_keeps_the_index_current():
    t = Transcript("p", parties=["server", "client:0"])
    assert t.private("client:0") == {} and not t.has_private
    t.add(0, "client:0", "client:0", "private", {"items": np.arange(3)})
    t.add(0, "client:0", "server", "grad_V", {"values": np.ones(2)})
    assert t.has_private
    np.testing.assert_array_equal(t.private("client:0")["items"], np.arange(3))
    assert [m.seq for m in t.select("grad_V", receiver="server")] == [1]
    # a message appended to the list directly (not through add) is still found
    t.messages.append(Message(2, 1, "client:0", "server", "grad_V", {"values": np.zeros(2)}))
    assert [m.seq for m in t.select("grad_V", sender="client:0")] == [1, 2]


class _CountingList(list):
    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


def test_queries_after_the_first_do_not_scan_the_messages():
    t = _random_transcript(3, n=300)
    t.messages = _CountingList(t.messages)
    t.private("client:0")  # builds the index: one pass
    before = _CountingList.iterations
    for party in PARTIES:
        t.private(party)
        t.view(party)
        t.select("grad_V", sender=party)
        t.select(receiver=party)
    assert _CountingList.iterations == before


def test_loaded_and_unpickled_transcripts_answer_the_same(tmp_path):
    t = _random_transcript(4, n=120)
    t.private("client:2")
    back = load(save(t, tmp_path / "t.ptx"))
    clone = pickle.loads(pickle.dumps(t))
    assert "_index" not in pickle.loads(pickle.dumps(t)).__dict__
    for other in (back, clone):
        for party in PARTIES:
            assert [m.seq for m in other.view(party).messages] == [m.seq for m in t.view(party).messages]
            assert sorted(other.private(party)) == sorted(t.private(party))


@pytest.mark.parametrize("seed", [5, 6])
def test_a_loaded_index_is_built_from_the_message_table_as_messages_would_build_it(tmp_path, seed):
    from privaudit.transcript import _Index

    t = _random_transcript(seed, n=300)
    back = load(save(t, tmp_path / "t.ptx"))
    built = back.__dict__["_index"]  # set by the loader, before any query
    oracle = _Index(back.messages)  # one append per message
    for name in ("by_kind", "by_sender", "by_receiver", "by_sender_kind", "by_receiver_kind", "private"):
        got, want = getattr(built, name), getattr(oracle, name)
        assert list(got.items()) == list(want.items()), name  # same lists, keys in the same order
    assert (built.n, built.last) == (oracle.n, oracle.last) and back._messages_index() is built
    with pytest.raises(ValueError, match="distinct names"):
        back.index_from_codes(np.zeros((len(back), 3), dtype=np.int64), ["a", "a"])
