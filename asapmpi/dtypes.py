"""The element types an Exchange moves: float32, float64, bfloat16 and float16.

float16 and bfloat16 are reduced in float32 and rounded to nearest even once per element
(asap_wsum_f16, asap_wsum_bf16); MPI has neither, so allreduce sums them in float32 too.

NumPy has no bfloat16: a bfloat16 buffer is a 2-byte integer array of the bit patterns
(torch: ``tensor.view(torch.int16).numpy()``) given to the Exchange with
``dtype="bfloat16"``; the verified reduce accumulates it in float32 and rounds to
nearest even once per element (asap_wsum_bf16).  The conversions here are for the few
places that compute on a buffer outside the reduce kernel (allreduce's sum, the
non-finite check), in NumPy."""
from __future__ import annotations

from typing import Optional

import numpy as np

#: element type -> bytes per element
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
#: element type -> the NumPy dtype an Exchange views the buffer as
NUMPY = {"float32": np.float32, "float64": np.float64, "bfloat16": np.uint16,
         "float16": np.float16}
#: the element types computed on in float32 and rounded back once
HALF = ("bfloat16", "float16")


def dtype_name(buffer) -> str:
    """The NumPy name of a buffer's element type (complex64, not the buffer protocol's
    'Zf'), for messages; its format code where NumPy has no name for it."""
    try:
        return np.asarray(buffer).dtype.name
    except (TypeError, ValueError):
        return f"format {memoryview(buffer).format!r}"


def numpy_dtype(name: str):
    """The NumPy dtype of a buffer of element type `name` (bfloat16: its bit patterns)."""
    return NUMPY[name]


def bf16_to_f32(bits: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact)."""
    wide = np.left_shift(bits.astype(np.uint32), 16)
    if out is None:
        return wide.view(np.float32)
    out.view(np.uint32)[...] = wide
    return out


def f32_to_bf16(values: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """bfloat16 bit patterns of float32 values, rounded to nearest even (NaN stays NaN),
    as torch converts."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)
    if out is None:
        return bits
    out[...] = bits
    return out


def half_to_f32(array: np.ndarray, name: str,
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """float32 values of a buffer of half element type `name` (exact)."""
    if name == "bfloat16":
        return bf16_to_f32(array, out)
    if out is None:
        return array.astype(np.float32)
    out[...] = array
    return out


def f32_to_half(values: np.ndarray, name: str, out: np.ndarray) -> np.ndarray:
    """Write float32 `values` into `out`, a buffer of half element type `name`, rounded
    to nearest even."""
    if name == "bfloat16":
        return f32_to_bf16(values, out)
    out[...] = values       # NumPy's float32 -> float16 rounds to nearest even
    return out


def nonfinite(array: np.ndarray, name: str) -> np.ndarray:
    """Indices of the NaN and Inf elements of a buffer of element type `name`."""
    if name == "bfloat16":
        return np.flatnonzero((array & np.uint16(0x7F80)) == np.uint16(0x7F80))
    return np.flatnonzero(~np.isfinite(array))
