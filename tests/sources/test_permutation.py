from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.errors import ConfigError
from zephon_core.sources import KeyedPermutation

pytestmark = pytest.mark.filterwarnings("error")


def test_bijection_exhaustive_small_n_scalar_equals_vectorized() -> None:
    for n in range(1, 301):
        perm = KeyedPermutation(n, key=n * 7919)
        scalar = [perm(i) for i in range(n)]
        assert sorted(scalar) == list(range(n)), n
        vec = perm.map_array(np.arange(n, dtype=np.int64))
        assert vec.dtype == np.int64
        assert vec.tolist() == scalar, n


@pytest.mark.parametrize("n", [4096, 65_537, 100_000, (1 << 20) + 3])
def test_bijection_large_n_vectorized(n: int) -> None:
    perm = KeyedPermutation(n, key=12345)
    out = perm.map_array(np.arange(n, dtype=np.int64))
    assert out.min() == 0 and out.max() == n - 1
    assert np.unique(out).size == n
    sample = np.arange(0, n, 997)
    assert [perm(int(i)) for i in sample] == out[sample].tolist()


def test_n_one_and_tiny_domains() -> None:
    assert KeyedPermutation(1, key=5)(0) == 0
    assert KeyedPermutation(1, key=5).map_array(np.zeros(3, dtype=np.int64)).tolist() == [0, 0, 0]
    assert KeyedPermutation(1, key=0).half_bits == 1
    assert KeyedPermutation(4, key=0).half_bits == 1
    assert KeyedPermutation(5, key=0).half_bits == 2


def test_different_keys_give_different_permutations() -> None:
    n = 1000
    perms = {tuple(KeyedPermutation(n, key=k).map_array(np.arange(n))) for k in range(32)}
    assert len(perms) == 32
    ident = tuple(range(n))
    assert ident not in perms


def test_looks_shuffled() -> None:
    n = 10_000
    out = KeyedPermutation(n, key=99).map_array(np.arange(n))
    assert int((out == np.arange(n)).sum()) < 10  # ~1 fixed point expected
    # Neighbouring positions land far apart on average (~n/3 for a random permutation).
    assert 0.25 * n < float(np.abs(np.diff(out)).mean()) < 0.42 * n


def test_huge_n_constant_memory() -> None:
    tracemalloc.start()
    try:
        perm = KeyedPermutation(10**9, key=2024)
        values = [perm(i) for i in (0, 1, 10**9 - 1, 123_456_789)]
        vec = perm.map_array(np.array([0, 1, 10**9 - 1, 123_456_789], dtype=np.int64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert all(0 <= v < 10**9 for v in values)
    assert len(set(values)) == 4
    assert vec.tolist() == values


def test_max_n_and_wrapping_without_warnings() -> None:
    n = 1 << 63
    perm = KeyedPermutation(n, key=(1 << 64) - 1)
    idx = np.array([0, 1, n - 1, 1 << 62], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = perm.map_array(idx)
    assert out.tolist() == [perm(int(i)) for i in idx]
    assert all(0 <= v < n for v in out.tolist())


def test_map_array_shapes_and_dtypes() -> None:
    perm = KeyedPermutation(50, key=3)
    grid = np.arange(50, dtype=np.int32).reshape(5, 10)
    out = perm.map_array(grid)
    assert out.shape == (5, 10) and out.dtype == np.int64
    assert out.ravel().tolist() == [perm(i) for i in range(50)]
    assert perm.map_array(np.array([], dtype=np.int64)).shape == (0,)


def test_key_only_low_64_bits_matter() -> None:
    a = KeyedPermutation(777, key=5)
    b = KeyedPermutation(777, key=5 + (1 << 64))
    assert a.map_array(np.arange(777)).tolist() == b.map_array(np.arange(777)).tolist()


@pytest.mark.parametrize(
    "kwargs",
    [{"n": 0}, {"n": -3}, {"n": 1 << 64}, {"n": 2.5}, {"n": True}, {"key": "a"}, {"rounds": 3}],
)
def test_bad_config(kwargs: dict) -> None:
    args = {"n": 10, "key": 1, **kwargs}
    with pytest.raises(ConfigError):
        KeyedPermutation(**args)


def test_out_of_range_index() -> None:
    perm = KeyedPermutation(10, key=1)
    with pytest.raises(IndexError):
        perm(10)
    with pytest.raises(IndexError):
        perm(-1)
    with pytest.raises(IndexError):
        perm.map_array(np.array([0, 10]))
    with pytest.raises(TypeError):
        perm.map_array(np.array([0.5]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 5000),
    keys=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6),
    data=st.data(),
)
def test_map_many_equals_one_permutation_per_key(n, keys, data):
    from zephon_core.sources.permutation import map_many

    m = data.draw(st.integers(1, 60))
    which = np.array(data.draw(st.lists(st.integers(0, len(keys) - 1), min_size=m, max_size=m)))
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)))
    want = [KeyedPermutation(n, keys[w])(int(i)) for w, i in zip(which, idx)]
    assert map_many(n, keys, which, idx).tolist() == want
