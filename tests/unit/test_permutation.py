"""The project's keyed permutation: pinned values, an independent reference implementation of
the specification in plain Python integers, bijectivity, slices, inverse, errors and cost.

The goldens pin the data order of every pipeline: changing one is a deliberate act (bump
FINGERPRINT_VERSION and the checkpoint format, as for the move from numpy's streams).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_server.engine import permutation as perm_mod
from zephon_server.engine.permutation import MAX_N, SMALL_N, Permutation, round_keys

pytestmark = pytest.mark.timeout(60)

M64 = (1 << 64) - 1
A = 0x9E3779B97F4A7C15
B = 0xBF58476D1CE4E5B9


def ref_keys(key: tuple[int, ...], n: int) -> list[int]:
    """Step 1 of the specification, written again from the docstring."""
    text = "zephon-permutation-v1:" + str(n) + ":" + ",".join(str(k) for k in key)
    digest = hashlib.blake2b(text.encode("ascii"), digest_size=64).digest()
    return [int.from_bytes(digest[i : i + 8], "little") for i in range(0, 64, 8)]


def ref_f(k: int, r: int) -> int:
    u = ((r ^ k) * A) & M64
    return (((u ^ (u >> 32)) * B) & M64) >> 1


def ref_at(key: tuple[int, ...], n: int, i: int) -> int:
    """``Permutation(key, n).at(i)`` by the specification, in plain Python integers."""
    keys = ref_keys(key, n)
    if n <= 256:
        return sorted(range(n), key=lambda j: (ref_f(keys[0], j), j))[i]
    m = math.isqrt(n - 1) + 1
    x = i
    while True:
        left, right = divmod(x, m)
        for k in keys:
            left, right = right, (left + ref_f(k, right)) % m
        x = left * m + right
        if x < n:
            return x


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(",".join(map(str, values.tolist())).encode()).hexdigest()


# (key, n): first values, last values, sha256 of the decimal values joined by commas.
GOLDEN = {
    ((0,), 1): ([0], [0], "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9"),
    ((1,), 2): ([0, 1], [0, 1], "83b97b859aa5f81b2f0f86ba2a675efaf515ad2d5e2b8652cf2de7e1c2267350"),
    ((2,), 2): ([1, 0], [1, 0], "b0e4f9bb7b55e4b181760ae93c958c14b451a7556206dfa952d81f0f2165a9da"),
    ((7, 3), 3): (
        [2, 0, 1],
        [2, 0, 1],
        "cea67d8b58d72bb9387778326578aa3e58971aeb9f43ff6eaa599fbdeb5a3103",
    ),
    ((7, 3), 10): (
        [7, 4, 6, 9, 2, 5],
        [0, 3, 8],
        "aed493cfa560a3d05ea72bf328f38930d1a12e54d9ef385cddde45027e223f01",
    ),
    ((2026, 5), 1000): (
        [143, 202, 178, 931, 208, 1],
        [225, 457, 57],
        "8d46285c8ba256809f9313d23074a22c62d390e7b91e9428320368c4e2b8957c",
    ),
    ((0x5A524F, 1234, 0, 0, 3), 2**20 + 7): (
        [21380, 469961, 654047, 224605, 322398, 800477],
        [858662, 273390, 925120],
        "2ca3771ea868f4966a35696f60a5d876f63bc61a1021cfaea8ce91e2b1e0894c",
    ),
}

# Sizes too large to enumerate: values at indices 0, 1, 2, n // 2, n - 1 (the second is past
# TABLE_MAX_M ** 2, so the round function is evaluated, not tabulated).
GOLDEN_LARGE = {
    ((9,), 2**24 + 1): [15726002, 16072568, 7944568, 8367641, 8986334],
    ((9,), 2**62): [
        4137114826426340821,
        3750950522060047565,
        614786278915179416,
        3655295564982913460,
        1386285797963262674,
    ],
}


@pytest.mark.parametrize(("key", "n"), list(GOLDEN), ids=[f"n={n}" for _, n in GOLDEN])
def test_golden(key, n):
    first, last, sha = GOLDEN[(key, n)]
    full = Permutation(key, n).full()
    assert full[: len(first)].tolist() == first
    assert full[-len(last) :].tolist() == last
    assert digest(full) == sha


@pytest.mark.parametrize(("key", "n"), list(GOLDEN_LARGE), ids=["n=2**24+1", "n=2**62"])
def test_golden_large(key, n):
    idx = np.array([0, 1, 2, n // 2, n - 1], dtype=np.int64)
    assert Permutation(key, n).at(idx).tolist() == GOLDEN_LARGE[(key, n)]


@pytest.mark.parametrize(
    ("key", "n"),
    [
        *[((0,), 1), ((5,), 2), ((7, 3), 3), ((1, 2), 256), ((1, 2), 257), ((3,), 1000)],
        *[((-4, 10**30), 4099), ((9,), 2**24 + 1), ((9,), 2**40 + 3), ((9,), 2**62)],
    ],
)
def test_matches_the_specification_written_in_plain_integers(key, n):
    indices = sorted(i for i in {0, 1, n // 3, n // 2, n - 2, n - 1} if 0 <= i < n)
    got = Permutation(key, n).at(np.array(indices, dtype=np.int64)).tolist()
    assert got == [ref_at(key, n, i) for i in indices]
    assert list(round_keys(key, n)) == ref_keys(key, n)


def test_tabulated_and_evaluated_round_functions_agree(monkeypatch):
    for n in (300, 5000, 70_001):
        tabulated = Permutation((4, n), n)
        assert tabulated._tables is not None
        monkeypatch.setattr(perm_mod, "TABLE_MAX_M", 1)
        evaluated = Permutation((4, n), n)
        monkeypatch.undo()
        assert evaluated._tables is None
        full = tabulated.full()
        assert np.array_equal(evaluated.full(), full)
        assert np.array_equal(evaluated.index_of(full), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    key=st.lists(st.integers(-(2**70), 2**70), min_size=0, max_size=4).map(tuple),
)
def test_bijective_and_inverse(n, key):
    p = Permutation(key, n)
    full = p.full()
    assert full.dtype == np.int64
    assert np.array_equal(np.sort(full), np.arange(n))
    assert np.array_equal(p.index_of(full), np.arange(n))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(SMALL_N + 1, MAX_N), seed=st.integers(0, 2**32))
def test_large_domains_stay_in_range_distinct_and_invertible(n, seed):
    p = Permutation((seed,), n)
    rng = np.random.default_rng(seed)  # only picks which indices to look at
    idx = np.unique(rng.integers(0, n, size=300, dtype=np.int64))
    values = p.at(idx)
    assert values.min() >= 0 and values.max() < n
    assert len(np.unique(values)) == len(idx)
    assert np.array_equal(p.index_of(values), idx)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 5000),
    bounds=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    seed=st.integers(0, 1000),
)
def test_slices_and_index_arrays_equal_the_full_permutation(n, bounds, seed):
    p = Permutation((seed, 1), n)
    full = p.full()
    start, stop = sorted(int(b * n) for b in bounds)
    assert np.array_equal(p.at_range(start, stop), full[start:stop])
    assert np.array_equal(p.at(np.arange(start, stop)), full[start:stop])
    idx = np.random.default_rng(seed).integers(0, n, size=(3, 7))
    assert np.array_equal(p.at(idx), full[idx])
    assert np.array_equal(p.at(idx.astype(np.uint32)), full[idx])
    assert p.at([n - 1]).tolist() == [full[-1]]


def test_large_requests_are_evaluated_in_blocks_with_the_same_values():
    p = Permutation((8,), 10**6)
    full = p.full()
    assert np.array_equal(np.sort(full), np.arange(10**6))
    assert np.array_equal(full[123_456:200_000], p.at_range(123_456, 200_000))


def test_keys_are_canonical_and_separate_uses():
    values = {
        key: Permutation(key, 1000).at_range(0, 16).tolist()
        for key in [(1, 23), (12, 3), (1, 2, 3), (123,), (-1, 23), ()]
    }
    assert len({tuple(v) for v in values.values()}) == len(values)
    # The size is part of the key: another size gives unrelated round keys.
    assert round_keys((1, 2), 10) != round_keys((1, 2), 11)
    assert (
        Permutation((np.int64(7), 3), 10).full().tolist() == Permutation((7, 3), 10).full().tolist()
    )


def test_small_orders_are_all_reached_evenly():
    # n = 3 over 6000 keys: each of the 6 orders close to 1000 (chi-square, 5 degrees).
    counts = Counter(tuple(Permutation((k,), 3).full().tolist()) for k in range(6000))
    assert len(counts) == 6
    assert sum((c - 1000) ** 2 / 1000 for c in counts.values()) < 25
    # n = 1000 over 3000 keys: where index 0 goes, in 10 bins (9 degrees).
    first = [int(Permutation((k, 2), 1000).at_range(0, 1)[0]) for k in range(3000)]
    bins = np.bincount(np.array(first) // 100, minlength=10)
    assert float(((bins - 300) ** 2 / 300).sum()) < 30


def test_consecutive_indices_land_far_apart():
    n = 2**20 + 7
    values = Permutation((3,), n).at_range(0, 100_000).astype(np.float64)
    assert abs(np.corrcoef(np.arange(100_000), values)[0, 1]) < 0.02
    assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 0.02
    assert abs(np.abs(np.diff(values)).mean() / n - 1 / 3) < 0.01  # as for independent draws


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (((1,), 0), r"n must be an integer in \[1, 2\*\*62\], got 0"),
        (((1,), MAX_N + 1), "got 4611686018427387905"),
        (((1,), True), "got True"),
        (((1,), 10.0), "got 10.0"),
        (((1.5,), 10), r"key must hold integers, got 1.5 in \(1.5,\)"),
    ],
)
def test_bad_arguments(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        Permutation(*args)


def test_bad_indices():
    p = Permutation((1,), 10)
    with pytest.raises(ValueError, match="index 10 is out of range for a permutation of n=10"):
        p.at([3, 10])
    with pytest.raises(ValueError, match="index -1 is out of range"):
        p.index_of(np.array([-1, 2]))
    with pytest.raises(ValueError, match="must be integers, got dtype float64"):
        p.at(np.array([1.0]))
    with pytest.raises(ValueError, match=r"range \[4, 11\) is not inside \[0, 10\)"):
        p.at_range(4, 11)
    assert p.at(np.array([], dtype=np.int64)).tolist() == []


def test_uint64_arithmetic_raises_no_warnings():
    with np.errstate(all="raise"):
        for n in (3, 1000, 2**30 + 1, 2**62):
            p = Permutation((n,), n)
            p.index_of(p.at(np.array([0, n - 1])))


def test_cost_is_tens_of_microseconds_for_a_chunk_and_under_a_second_for_a_million():
    p = Permutation((0x5A524F, 0, 1, 2, 3), 2**20 + 7)
    p.at_range(0, 256)
    timings = []
    for i in range(200):
        t = time.perf_counter()
        p.at_range(1000 + i, 1256 + i)
        timings.append(time.perf_counter() - t)
    assert sorted(timings)[100] < 1e-3  # about 30 us on an idle core; loose for busy machines
    t = time.perf_counter()
    Permutation((1,), 10**6).full()
    assert time.perf_counter() - t < 1.0
