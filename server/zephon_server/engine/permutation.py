"""The project's own keyed permutation of ``range(n)``: data order that no dependency can change.

The work source orders shards, rows and lanes with :class:`Permutation`. It is specified here
completely, so that it can be reimplemented in any language, and it uses no random number
generator, so no numpy (or Python) release can change it. ``at(i)`` needs O(1) memory and
expected O(1) time per index, so a shard's row order is never stored.

**Specification** of ``Permutation(key, n)``, ``key`` a tuple of integers, ``1 <= n <= 2**62``.
All arithmetic in steps 2 to 4 is on unsigned 64-bit integers, modulo ``2**64``.

1. *Key.* The ASCII text ``"zephon-permutation-v1:" + dec(n) + ":" + ",".join(dec(k) for k in
   key)``, where ``dec`` is the shortest decimal form (``-`` for negatives, no leading zeros), is
   hashed with BLAKE2b-512 (no key, salt or personalisation; 64-byte digest). Round key ``k_i``
   (``i = 0 .. 7``) is the little-endian unsigned 64-bit integer of digest bytes ``8i .. 8i+7``.
2. *Round function.* With ``A = 0x9E3779B97F4A7C15`` and ``B = 0xBF58476D1CE4E5B9``:
   ``u = (r xor k_i) * A``; ``F_i(r) = ((u xor (u >> 32)) * B) >> 1`` (so ``F_i(r) < 2**63``).
3. *Small n.* For ``n <= SMALL_N`` (256), ``at(i)`` is the ``i``-th element of ``range(n)``
   sorted by ``(F_0(j), j)`` ascending. (A network over few digits reaches the orders of a
   small ``n`` unevenly.) Steps 4 to 6 are for ``n > SMALL_N``.
4. *Domain.* ``m = isqrt(n - 1) + 1``, the smallest ``m`` with ``m * m >= n``. The network
   permutes ``range(m * m)``; a value ``x`` is the pair of digits ``L = x // m``, ``R = x % m``.
5. *Rounds.* :data:`ROUNDS` = 8 Feistel rounds, ``i = 0 .. 7``:
   ``(L, R) <- (R, (L + F_i(R)) mod m)`` (no overflow: ``L < 2**31``). The result is
   ``E(x) = L * m + R``. A round is a bijection of the pairs (``L = (R' - F_i(L')) mod m``
   undoes it), so ``E`` permutes ``range(m * m)``.
6. *Cycle walking.* ``at(i)`` for ``0 <= i < n`` is the first of ``E(i), E(E(i)), ...`` that is
   ``< n``; the walk ends because ``E`` is a permutation, and ``at`` permutes ``range(n)``.
   ``m * m - n < 2 * m``, so fewer than ``2 / sqrt(n)`` of the indices walk at all.

``index_of`` is the inverse (the same walk with the rounds undone in reverse order).

Why so (see docs/decisions.md): two base-``m`` digits instead of two bit halves keep the
network's domain within ``2 * sqrt(n)`` of ``n``, so cycle walking almost never happens; eight
rounds of a multiply-xorshift mixer leave no visible structure even between consecutive
indices; the key is hashed, never drawn from an RNG. Evaluation is vectorised on numpy
``uint64`` arrays, which wrap silently as the specification needs (every constant is an
``np.uint64``, so nothing is promoted to float). For ``m <= TABLE_MAX_M`` the values
``F_i(r) mod m`` are tabulated once per permutation: the same numbers, fewer array operations.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Sequence

import numpy as np

__all__ = ["MAX_N", "ROUNDS", "SMALL_N", "Permutation"]

ROUNDS = 8
MAX_N = 1 << 62
SMALL_N = 256
TABLE_MAX_M = 1 << 12
"""Largest ``m`` whose round values are tabulated (8 tables of ``m`` int64: <= 256 KiB)."""

_KEY_PREFIX = "zephon-permutation-v1:"
_A = np.uint64(0x9E3779B97F4A7C15)
_B = np.uint64(0xBF58476D1CE4E5B9)
_S32 = np.uint64(32)
_S1 = np.uint64(1)
_BLOCK = 1 << 16  # indices evaluated per step of a large request (keeps temporaries small)


def round_keys(key: Sequence[int], n: int) -> tuple[int, ...]:
    """The :data:`ROUNDS` round keys of ``Permutation(key, n)`` (specification, step 1)."""
    text = _KEY_PREFIX + str(int(n)) + ":" + ",".join(str(int(k)) for k in key)
    digest = hashlib.blake2b(text.encode("ascii"), digest_size=64).digest()
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(ROUNDS))


def _mix(r: np.ndarray, k: np.uint64) -> np.ndarray:
    """``F_i(r)`` of the specification for a uint64 array ``r`` (a new array)."""
    u = r ^ k
    u *= _A
    u ^= u >> _S32
    u *= _B
    u >>= _S1
    return u


class Permutation:
    """A keyed bijection of ``range(n)``, specified in the module docstring.

    ``key`` is a tuple of integers (the work source uses a domain tag, the seed and the
    dataset/pass/shard or block numbers). Cheap to build; holds only the round keys (and, for
    ``n <= TABLE_MAX_M ** 2``, small tables of the round function; for ``n <= SMALL_N`` the
    order itself).
    """

    __slots__ = ("_inverse", "_keys", "_m", "_mu", "_order", "_tables", "key", "n")
    key: tuple[int, ...]
    n: int
    _m: int
    _mu: np.uint64
    _keys: tuple[np.uint64, ...]
    _tables: tuple[np.ndarray, ...] | None
    _order: np.ndarray | None
    _inverse: np.ndarray | None

    def __init__(self, key: Sequence[int], n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_N:
            raise ValueError(f"permutation size n must be an integer in [1, 2**62], got {n!r}")
        for part in key:
            if isinstance(part, bool) or not isinstance(part, numbers.Integral):
                raise ValueError(f"permutation key must hold integers, got {part!r} in {key!r}")
        self.key = tuple(int(k) for k in key)
        self.n = int(n)
        self._m = math.isqrt(self.n - 1) + 1
        self._mu = np.uint64(self._m)
        self._keys = tuple(np.uint64(k) for k in round_keys(self.key, self.n))
        self._tables = None
        self._order = None
        self._inverse = None
        if self.n <= SMALL_N:
            ranks = _mix(np.arange(self.n, dtype=np.uint64), self._keys[0])
            self._order = np.argsort(ranks, kind="stable").astype(np.int64)
            self._inverse = np.argsort(self._order, kind="stable").astype(np.int64)
        elif self._m <= TABLE_MAX_M:
            digits = np.arange(self._m, dtype=np.uint64)
            self._tables = tuple((_mix(digits, k) % self._mu).astype(np.int64) for k in self._keys)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(key={self.key!r}, n={self.n})"

    # ------------------------------------------------------------------ public

    def at(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """The permuted values of ``indices`` (each in ``[0, n)``), as int64 of the same shape.

        ``ValueError`` names the first index out of range.
        """
        idx = self._checked(indices)
        return self._apply(idx.reshape(-1), forward=True).reshape(idx.shape)

    def at_range(self, start: int, stop: int) -> np.ndarray:
        """``at(arange(start, stop))`` (int64), for ``0 <= start <= stop <= n``."""
        if not 0 <= start <= stop <= self.n:
            raise ValueError(f"range [{start}, {stop}) is not inside [0, {self.n})")
        return self._apply(np.arange(start, stop, dtype=np.int64), forward=True)

    def index_of(self, values: np.ndarray | Sequence[int]) -> np.ndarray:
        """The inverse: the indices ``i`` with ``at(i) == v`` for each value ``v`` (int64)."""
        val = self._checked(values)
        return self._apply(val.reshape(-1), forward=False).reshape(val.shape)

    def full(self) -> np.ndarray:
        """The whole permutation, ``at(arange(n))`` (n int64 values: only for small ``n``)."""
        return self.at_range(0, self.n)

    # ------------------------------------------------------------------ evaluation

    def _checked(self, values: np.ndarray | Sequence[int]) -> np.ndarray:
        arr = np.asarray(values)
        if arr.size == 0:
            return arr.astype(np.int64)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"permutation indices must be integers, got dtype {arr.dtype}")
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high >= self.n:
            bad = low if low < 0 else high
            raise ValueError(f"index {bad} is out of range for a permutation of n={self.n}")
        return arr.astype(np.int64, copy=False)

    def _apply(self, x: np.ndarray, forward: bool) -> np.ndarray:
        """Cycle-walked encryption (or decryption) of a flat int64 array of indices < n."""
        if self._order is not None and self._inverse is not None:
            return (self._order if forward else self._inverse)[x]
        if len(x) > _BLOCK:
            parts = [self._apply(x[i : i + _BLOCK], forward) for i in range(0, len(x), _BLOCK)]
            return np.concatenate(parts)
        step = self._encrypt if forward else self._decrypt
        y = step(x)
        if self._m * self._m == self.n:
            return y
        walk = np.flatnonzero(y >= self.n)
        while walk.size:
            z = step(y[walk])
            y[walk] = z
            walk = walk[z >= self.n]
        return y

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        m = self._m
        hi, lo = np.divmod(x, m)
        if self._tables is not None:
            for table in self._tables:
                t = table[lo]
                t += hi
                t %= m
                hi, lo = lo, t
            return hi * m + lo
        hu, lu = hi.astype(np.uint64), lo.astype(np.uint64)
        for k in self._keys:
            t = _mix(lu, k)
            t += hu
            t %= self._mu
            hu, lu = lu, t
        return (hu * self._mu + lu).astype(np.int64)

    def _decrypt(self, y: np.ndarray) -> np.ndarray:
        m = self._m
        hi, lo = np.divmod(y, m)
        if self._tables is not None:
            for table in reversed(self._tables):
                t = lo - table[hi]
                t %= m  # int64 %: the result has the sign of m, so it is in [0, m)
                hi, lo = t, hi
            return hi * m + lo
        hu, lu = hi.astype(np.uint64), lo.astype(np.uint64)
        for k in reversed(self._keys):
            f = _mix(hu, k) % self._mu
            t = lu + self._mu  # lo + m - f, in [1, 2m): never wraps
            t -= f
            t %= self._mu
            hu, lu = t, hu
        return (hu * self._mu + lu).astype(np.int64)
