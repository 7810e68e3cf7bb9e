"""The slot store on its own: the verified fused reduce over slots in plain host memory,
with no MPI call and no window (asapmpi/_core/slotstore.pxi).

Every channel reduces through this store, so what these tests pin down (which input is
consistent, torn, stale or ahead, what is summed, what is undone) holds on every
transport; the multi-rank tests show the channels bring the bytes."""
import pathlib
import re

import numpy as np
import pytest

from asapmpi._core import AHEAD, CONSISTENT, STALE, TORN, Layout, SlotStore, kernels
from asapmpi.errors import ConfigError

N = 40                      # float64 elements: one payload of 320 bytes
HEADER = 64


def _slots(n_in, n=N, dtype=np.float64):
    """Host memory holding n_in slots laid out as a window's, and their offsets."""
    layout = Layout(n_in=n_in, n_out=0, depth=1, nbytes=n * np.dtype(dtype).itemsize)
    memory = np.zeros(layout.total, dtype=np.uint8)
    offsets = [layout.slot_disp(i) for i in range(n_in)]
    store = SlotStore(n_in, layout.nbytes, layout.payload_stride, np.dtype(dtype).name)
    return layout, memory, offsets, store


def _write(layout, memory, offset, version, payload, footer=None, checksum=False):
    """A complete write of `payload` as `version` (footer: another version, a tear)."""
    words = memory.view(np.int64)
    start = offset + HEADER
    memory[start:start + payload.nbytes] = payload.view(np.uint8)
    words[offset // 8] = version
    foot = offset + HEADER + layout.payload_stride
    words[foot // 8] = version if footer is None else footer
    words[foot // 8 + 1] = np.int64(np.uint64(kernels.checksum(payload))) if checksum else 0


def test_reduce_sums_the_consistent_inputs_with_their_weights():
    layout, memory, offsets, store = _slots(3)
    inputs = [np.full(N, float(i + 1)) for i in range(3)]
    for i in range(3):
        _write(layout, memory, offsets[i], 5, inputs[i])
    own = np.arange(N, dtype=np.float64)
    buf = own.copy()
    weights = np.array([0.1, 0.2, 0.3])
    used = store.reduce_slots(buf, 0.4, weights, memory, offsets, [5, 5, 5],
                              min_version=5, max_version=5)
    assert used == 3
    np.testing.assert_allclose(buf, 0.4 * own + 0.1 * 1 + 0.2 * 2 + 0.3 * 3)
    assert store.last_status() == [CONSISTENT] * 3
    assert store.stats[:, CONSISTENT].tolist() == [1, 1, 1]
    assert store.last_versions.tolist() == [5, 5, 5]


def test_each_status_is_told_apart_and_only_usable_inputs_are_summed():
    layout, memory, offsets, store = _slots(4)
    _write(layout, memory, offsets[0], 7, np.full(N, 1.0))              # consistent
    _write(layout, memory, offsets[1], 8, np.full(N, 100.0), footer=7)   # torn
    _write(layout, memory, offsets[2], 6, np.full(N, 100.0))             # stale
    _write(layout, memory, offsets[3], 9, np.full(N, 100.0))             # ahead
    buf = np.zeros(N)
    used = store.reduce_slots(buf, 0.5, np.full(4, 0.125), memory, offsets, [7] * 4,
                              min_version=7, max_version=7)
    assert used == 1
    assert store.last_status() == [CONSISTENT, TORN, STALE, AHEAD]
    np.testing.assert_allclose(buf, 0.125)
    row = np.zeros(5, dtype=np.int64)
    store.record_reduced(row, 11)
    assert row.tolist() == [11, 7, 0, 0, 0]


def test_renormalize_keeps_the_weights_sum_over_the_usable_inputs():
    layout, memory, offsets, store = _slots(2)
    _write(layout, memory, offsets[0], 3, np.full(N, 2.0))
    buf = np.full(N, 4.0)
    store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [3, 3],
                       min_version=3, max_version=3, renormalize=True)
    # input 1 never written (version 0): the two usable weights 0.5 and 0.25 scaled to 1
    np.testing.assert_allclose(buf, (0.5 * 4.0 + 0.25 * 2.0) / 0.75)


def test_a_slot_not_pointed_at_is_never_read_and_counted_stale():
    layout, memory, offsets, store = _slots(2)
    for i in range(2):
        _write(layout, memory, offsets[i], 4, np.full(N, 1.0))
    buf = np.zeros(N)
    used = store.reduce_slots(buf, 1.0, np.array([0.5, 0.5]), memory, [offsets[0], -1],
                              [4, 4], min_version=4, max_version=4)
    assert used == 1
    assert store.last_status() == [CONSISTENT, STALE]
    assert store.last_versions.tolist() == [4, 0]


def test_a_checksum_finds_a_payload_torn_under_agreeing_versions():
    layout, memory, offsets, store = _slots(2)
    good, bad = np.full(N, 1.0), np.full(N, 2.0)
    _write(layout, memory, offsets[0], 2, good, checksum=True)
    _write(layout, memory, offsets[1], 2, bad, checksum=True)
    memory.view(np.float64)[(offsets[1] + HEADER) // 8 + 3] = 99.0    # one element flipped
    own = np.full(N, 10.0)
    buf = own.copy()
    used = store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [2, 2],
                              min_version=2, max_version=2, checksum=True)
    assert used == 1
    assert store.last_status() == [CONSISTENT, TORN]
    # recomputed from the copy of the own buffer, without the torn input
    np.testing.assert_allclose(buf, 0.5 * 10.0 + 0.25 * 1.0)


def test_require_all_leaves_the_buffer_as_it_was():
    layout, memory, offsets, store = _slots(2)
    _write(layout, memory, offsets[0], 2, np.full(N, 1.0), checksum=True)
    _write(layout, memory, offsets[1], 2, np.full(N, 2.0), checksum=True)
    memory.view(np.float64)[(offsets[1] + HEADER) // 8] = -1.0
    own = np.full(N, 10.0)
    buf = own.copy()
    r = store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [2, 2],
                           min_version=2, max_version=2, checksum=True, require_all=True)
    assert r == -3
    np.testing.assert_array_equal(buf, own)
    # an input that is stale before the pass: refused before anything is summed
    r = store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [3, 3],
                           min_version=3, max_version=3, require_all=True)
    assert r == -3
    np.testing.assert_array_equal(buf, own)


def test_exact_versions_per_input_in_float32():
    layout, memory, offsets, store = _slots(3, dtype=np.float32)
    for i, v in enumerate((4, 6, 9)):
        _write(layout, memory, offsets[i], v, np.full(N, float(i + 1), dtype=np.float32))
    buf = np.zeros(N, dtype=np.float32)
    used = store.reduce_slots(buf, 0.0, np.array([1.0, 1.0, 1.0]), memory, offsets,
                              [4, 5, 0], exact_each=True)
    assert used == 1
    assert store.last_status() == [CONSISTENT, AHEAD, STALE]
    np.testing.assert_allclose(buf, 1.0)


def test_bad_arguments_are_refused_in_one_line():
    _layout, memory, offsets, store = _slots(2)
    with pytest.raises(ConfigError, match="need 2 weights"):
        store.reduce_slots(np.zeros(N), 1.0, np.ones(3), memory, offsets, [1, 1])
    with pytest.raises(ConfigError, match="buffer has"):
        store.reduce_slots(np.zeros(N + 1), 1.0, np.ones(2), memory, offsets, [1, 1])
    with pytest.raises(ConfigError, match="not an aligned slot"):
        store.reduce_slots(np.zeros(N), 1.0, np.ones(2), memory, [offsets[0], 4], [1, 1])
    with pytest.raises(ConfigError, match="float64 elements of 8 bytes do not divide 12"):
        SlotStore(1, 12, 64, "float64")
    with pytest.raises(ConfigError, match="element type must be one of"):
        SlotStore(1, 16, 64, 8)


def test_the_store_makes_no_mpi_call():
    source = pathlib.Path(__file__).parents[2] / "asapmpi" / "_core" / "slotstore.pxi"
    code = "\n".join(line.split("#", 1)[0] for line in source.read_text().splitlines())
    assert not re.search(r"\bMPI_\w+\s*\(", code), "the slot store calls MPI"
    assert "CHKERR" not in code


def test_a_16_bit_reduce_also_gives_its_float32_sums_when_asked():
    from asapmpi.dtypes import bf16_to_f32, f32_to_bf16

    layout = Layout(n_in=2, n_out=0, depth=1, nbytes=N * 2)
    memory = np.zeros(layout.total, dtype=np.uint8)
    offsets = [layout.slot_disp(i) for i in range(2)]
    store = SlotStore(2, layout.nbytes, layout.payload_stride, "bfloat16")
    rng = np.random.default_rng(3)
    ins = [f32_to_bf16(rng.normal(size=N).astype(np.float32)) for _ in range(2)]
    for i in range(2):
        _write(layout, memory, offsets[i], 4, ins[i])
    own = f32_to_bf16(rng.normal(size=N).astype(np.float32))
    wide = np.full(N, np.nan, dtype=np.float32)
    store.set_wide(wide)
    buf = own.copy()
    assert store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [4, 4],
                              min_version=4, max_version=4) == 2
    f32 = [bf16_to_f32(x) for x in (own, *ins)]
    sums = (np.float32(0.5) * f32[0] + np.float32(0.25) * f32[1]) + np.float32(0.25) * f32[2]
    np.testing.assert_array_equal(wide, sums)
    np.testing.assert_array_equal(buf, f32_to_bf16(sums))
    # the rounding changed something (else the test could not tell the two apart)
    assert not np.array_equal(bf16_to_f32(buf), wide)
    assert store.wide_count == 1
    # a refused reduce writes no sums it would count
    assert store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [5, 5],
                              min_version=5, max_version=5, require_all=True) == -3
    assert store.wide_count == 1
    store.set_wide(None)
    store.reduce_slots(buf, 0.5, np.array([0.25, 0.25]), memory, offsets, [4, 4],
                       min_version=4, max_version=4)
    assert store.wide_count == 1
    with pytest.raises(ConfigError, match="one float32 per element"):
        store.set_wide(np.zeros(N + 1, dtype=np.float32))
    with pytest.raises(ConfigError, match="this store reduces float64"):
        _slots(1)[3].set_wide(np.zeros(N, dtype=np.float32))
