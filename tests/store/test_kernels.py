"""The fused weighted reduce against a NumPy reference, and the checksum."""
import threading

import numpy as np
import pytest

from asapmpi._core import kernels
from asapmpi.errors import ConfigError

# 1 to 2^20 + 5 elements, including sizes that are not a multiple of any vector width or
# of the kernel's block, and one block boundary exactly; 2^20 + 5 float64 (8 MB and a
# bit) is past ASAP_STREAM_MIN_BYTES, where a reduce into another buffer streams its
# blocks out, and float32 gets one such case of its own (STREAMED).  The kernel has no
# other path for larger buffers (blocks of ASAP_BLOCK_BYTES, no threads, size_t
# offsets): 2^24 elements ran the same blocks 16 times as often, 58 s of a full run.
SIZES = [1, 2, 3, 7, 15, 17, 1023, 4096, 4097, 65537, (1 << 20) + 5]
STREAMED = [((1 << 21) + 5, np.float32, 5)]


def reference(own, w_self, inputs, weights):
    """What NumPy computes for w_self*own + w_1*x_1 + ..., in that order."""
    dtype = own.dtype.type
    acc = dtype(w_self) * own
    for x, w in zip(inputs, weights):
        acc = acc + dtype(w) * x
    return acc


CASES = [(size, dtype, d) for size in SIZES for dtype in (np.float32, np.float64)
         for d in (1, 3, 5, 8)] + STREAMED


@pytest.mark.parametrize("size, dtype, d", CASES)
def test_fused_reduce_matches_numpy(size, dtype, d):
    # d = 5 and 8: inputs are folded four per pass, so these cross passes
    rng = np.random.default_rng(size * 7 + d)
    own = rng.standard_normal(size).astype(dtype)
    inputs = [rng.standard_normal(size).astype(dtype) for _ in range(d)]
    weights = list(rng.random(d) / (d + 1))
    w_self = 1.0 - sum(weights)
    ref = reference(own, w_self, inputs, weights)
    # with a checksum the kernel sums private copies of each block (a path of its own)
    for checksum in (False, True):
        out = np.empty_like(own)
        cks = kernels.weighted_sum(out, own, w_self, inputs, weights, checksum=checksum)
        # same operations in the same order, products rounded before the adds: bitwise
        np.testing.assert_array_equal(out, ref)
        if checksum:
            assert cks == [kernels.checksum(x) for x in inputs]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_reduce_in_place(dtype):
    rng = np.random.default_rng(1)
    own = rng.standard_normal(10001).astype(dtype)
    x = rng.standard_normal(10001).astype(dtype)
    ref = reference(own, 0.5, [x], [0.5])
    kernels.weighted_sum(own, own, 0.5, [x], [0.5])
    np.testing.assert_array_equal(own, ref)


def test_fused_reduce_with_no_inputs_scales():
    own = np.arange(5, dtype=np.float64)
    out = np.empty_like(own)
    kernels.weighted_sum(out, own, 2.0, [], [])
    np.testing.assert_array_equal(out, 2 * own)


def test_fused_reduce_refuses_mixed_dtypes_and_sizes():
    a32, a64 = np.zeros(4, np.float32), np.zeros(4, np.float64)
    with pytest.raises(ConfigError, match="one dtype"):
        kernels.weighted_sum(a32, a32, 1.0, [a64], [1.0])
    with pytest.raises(ConfigError, match="input 0 has 12 bytes"):
        kernels.weighted_sum(a32, a32, 1.0, [np.zeros(3, np.float32)], [1.0])
    with pytest.raises(ConfigError, match="float32, float64 or float16"):
        kernels.weighted_sum(np.zeros(4, np.int32), np.zeros(4, np.int32), 1.0, [], [])
    with pytest.raises(ConfigError, match="2 weights for 1 inputs"):
        kernels.weighted_sum(a32, a32, 1.0, [a32], [1.0, 2.0])


@pytest.mark.parametrize("size", [1, 7, 8, 31, 32, 33, 4096, 4099, 100003])
def test_fused_checksum_equals_writer_checksum(size):
    rng = np.random.default_rng(size)
    x = rng.standard_normal(size).astype(np.float32)
    out = np.empty_like(x)
    (ck,) = kernels.weighted_sum(out, x, 0.0, [x], [1.0], checksum=True)
    assert ck == kernels.checksum(x) != 0


def test_checksum_sees_value_and_position_changes():
    x = np.arange(1000, dtype=np.float64)
    base = kernels.checksum(x)
    y = x.copy()
    y[500] += 1e-9
    assert kernels.checksum(y) != base
    z = x.copy()
    z[[10, 11]] = z[[11, 10]]   # same words, swapped
    assert kernels.checksum(z) != base
    assert kernels.checksum(x[:999]) != base


def test_checksum_is_of_the_bytes_summed_while_the_input_changes():
    # A writer flips the input between two versions while the reduce reads it.  The
    # checksum the reduce returns must be of the bytes it summed: a result whose
    # checksum says "version A" is exactly A's sum (issue 15, point 1: a kernel that
    # read each block twice, once to sum and once to checksum, could sum some of B
    # and checksum A).  Reads that mix the two have a checksum of neither, which a
    # reader rejects.
    n = 16384
    rng = np.random.default_rng(15)
    a, b = rng.standard_normal(n), rng.standard_normal(n)
    own = np.zeros(n)
    x = a.copy()
    ck_a, ck_b = kernels.checksum(a), kernels.checksum(b)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            x[:] = b    # NumPy copies without the GIL: the reduce runs meanwhile
            x[:] = a

    writer = threading.Thread(target=flip)
    writer.start()
    whole, bad = 0, []
    try:
        for _ in range(20000):
            out = np.empty(n)
            (ck,) = kernels.weighted_sum(out, own, 0.0, [x], [1.0], checksum=True)
            if ck in (ck_a, ck_b):
                whole += 1
                expect = a if ck == ck_a else b
                if not (out == expect).all():
                    bad.append(("a" if ck == ck_a else "b", int((out != expect).sum())))
    finally:
        stop.set()
        writer.join()
    assert not bad, f"{len(bad)} reduces summed other bytes than they checksummed: {bad[:3]}"
    assert whole > 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_checksum_tells_apart_buffers_that_differ_only_in_exponents(dtype):
    # Floating-point words carry their information in their high bits (0.0 and 0.5
    # differ in the exponent only), and a sum modulo 2^64 of 2^m equal words drops the
    # top m bits: unmixed, zeros and "half 0.5, half zeros" had one checksum, so a torn
    # read between a fresh buffer and its first update passed.  Every prefix of a
    # second version over the first must checksum differently from the first.
    n = 16384
    for old, new in [(0.0, 0.5), (1.0, 2.0), (1.0, -1.0)]:
        first = np.full(n, old, dtype=dtype)
        base = kernels.checksum(first)
        for cut in range(16, n + 1, 16):
            torn = first.copy()
            torn[:cut] = new
            assert kernels.checksum(torn) != base, (old, new, cut)


def test_the_fold_is_inlined_into_every_vector_clone():
    # The fold is called from two target_clones functions; GCC once emitted it out of
    # line for the baseline target, so the AVX2 reduce ran scalar code (12x the
    # instructions, double-buffered 16 MB steps 1.5x slower).  An out-of-line fold
    # shows in the symbol table.
    import shutil
    import subprocess

    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    symbols = subprocess.run(["nm", kernels.__file__], capture_output=True, text=True,
                             check=True).stdout
    assert "asap_wsum_f32_block" in symbols, "the kernels' symbols are not in the table"
    assert "_fold" not in symbols, [s for s in symbols.splitlines() if "_fold" in s]
