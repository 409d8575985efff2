"""KeptByBytes: the missing keys of a lookup computed in one call, a byte budget, least
recently used out first."""

from creditflow.rollout.kept import KeptByBytes


def test_missing_keys_are_computed_once_in_one_call_in_first_seen_order():
    calls = []

    def compute(indices):
        calls.append(indices)
        return [f"v{i}" for i in indices]

    kept = KeptByBytes(max_bytes=100, nbytes=lambda value: 1)
    assert kept.lookup(["a", "b", "a", "c"], compute) == ["v0", "v1", "v0", "v3"]
    assert calls == [[0, 1, 3]] and (kept.hits, kept.misses) == (0, 3)
    assert kept.lookup(["c", "d", "a"], compute) == ["v3", "v1", "v0"]
    assert calls[-1] == [1] and (kept.hits, kept.misses) == (2, 4)
    assert kept.lookup(["a", "c"], compute) == ["v0", "v3"] and len(calls) == 2


def test_the_least_recently_used_goes_beyond_the_budget_and_an_oversized_value_is_not_kept():
    kept = KeptByBytes(max_bytes=10, nbytes=len)
    kept.lookup(["a", "b"], lambda indices: ["x" * 4, "y" * 4])
    kept.lookup(["a"], lambda indices: [])  # a is now the most recently used
    kept.lookup(["c"], lambda indices: ["z" * 4])  # 12 bytes: b goes
    assert kept.lookup(["a", "c"], lambda indices: []) == ["xxxx", "zzzz"]
    assert kept.lookup(["b"], lambda indices: ["again"]) == ["again"]
    kept.lookup(["big"], lambda indices: ["w" * 11])
    assert kept.lookup(["big"], lambda indices: ["fresh"]) == ["fresh"]


def test_an_uncacheable_batch_returns_none_and_keeps_nothing():
    kept = KeptByBytes(max_bytes=100, nbytes=lambda value: 1)
    assert kept.lookup(["a", "b"], lambda indices: None) is None
    assert len(kept) == 0
