# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The fused weighted-reduce and checksum kernels, callable on plain buffers.

The slot window uses the same C kernels on its slots; this module exposes them for
tests (against a NumPy reference) and for the core benchmark.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE
from libc.stdint cimport int64_t, uint16_t, uint64_t
from libc.stdlib cimport malloc, free
from mpi4py.libmpi cimport *

from asapmpi.dtypes import dtype_name
from asapmpi.errors import ConfigError

include "chkerr.pxi"


def weighted_sum(out, own, double w_self, inputs, weights, bint checksum=False,
                 bint bfloat16=False, float[::1] wide=None):
    """out = w_self*own + sum_i weights[i]*inputs[i], in one blocked pass.

    All buffers are contiguous float32 (or all float64, or all float16) of one size; `out`
    may be `own`.  bfloat16: the buffers hold bfloat16 bit patterns (2-byte integers).
    float16 and bfloat16 are reduced in float32 and rounded to nearest even once; `wide`
    (float32, one per element) then also gets the sums before that rounding.
    Returns the inputs' checksums (list of int) when `checksum` is true, else None.
    """
    cdef Py_ssize_t n_in = len(inputs)
    cdef Py_buffer vout, vown
    cdef Py_buffer *vins = NULL
    cdef const void **ptrs = NULL
    cdef double *w64 = NULL
    cdef float *w32 = NULL
    cdef asap_cksum_t *cks = NULL
    cdef Py_ssize_t i, got = 0, nbytes, itemsize
    cdef bint have_out = False, have_own = False
    cdef float *wide_ptr = NULL
    if len(weights) != n_in:
        raise ConfigError(f"{len(weights)} weights for {n_in} inputs")
    fmt = _format(out)
    if bfloat16:
        if fmt not in ("H", "h"):
            raise ConfigError(f"bfloat16 buffers are 2-byte integers (their bit "
                              f"patterns), got {dtype_name(out)}")
    elif fmt not in ("f", "d", "e"):
        raise ConfigError(f"weighted_sum takes float32, float64 or float16 buffers, got "
                          f"{dtype_name(out)}")
    for b in [own] + list(inputs):
        if _format(b) != fmt:
            raise ConfigError("weighted_sum needs every buffer of one dtype")
    itemsize = 2 if bfloat16 or fmt == "e" else (4 if fmt == "f" else 8)
    try:
        PyObject_GetBuffer(out, &vout, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
        have_out = True
        PyObject_GetBuffer(own, &vown, PyBUF_ANY_CONTIGUOUS)
        have_own = True
        nbytes = vout.len
        if vown.len != nbytes:
            raise ConfigError("own and out differ in size")
        if wide is not None:
            if itemsize != 2 or wide.shape[0] != nbytes // 2:
                raise ConfigError(f"wide= takes one float32 per element of a 16-bit "
                                  f"buffer ({nbytes // itemsize} elements of "
                                  f"{itemsize} bytes here), got {wide.shape[0]}")
            if wide.shape[0]:
                wide_ptr = &wide[0]
        vins = <Py_buffer *>malloc(max(n_in, 1) * sizeof(Py_buffer))
        ptrs = <const void **>malloc(max(n_in, 1) * sizeof(void *))
        w64 = <double *>malloc(max(n_in, 1) * sizeof(double))
        w32 = <float *>malloc(max(n_in, 1) * sizeof(float))
        cks = <asap_cksum_t *>malloc(max(n_in, 1) * sizeof(asap_cksum_t))
        if vins == NULL or ptrs == NULL or w64 == NULL or w32 == NULL or cks == NULL:
            raise MemoryError()
        for i in range(n_in):
            PyObject_GetBuffer(inputs[i], &vins[i], PyBUF_ANY_CONTIGUOUS)
            got += 1
            if vins[i].len != nbytes:
                raise ConfigError(f"input {i} has {vins[i].len} bytes, out has {nbytes}")
            ptrs[i] = vins[i].buf
            w64[i] = weights[i]
            w32[i] = <float>weights[i]
            asap_cksum_init(&cks[i])
        with nogil:
            if itemsize == 4:
                asap_wsum_f32(<float *>vout.buf, <const float *>vown.buf, <float>w_self,
                              <const float *const *>ptrs, w32, <int>n_in, nbytes // 4,
                              cks if checksum else NULL)
            elif itemsize == 2 and not bfloat16:
                asap_wsum_f16(<uint16_t *>vout.buf, <const uint16_t *>vown.buf,
                              <float>w_self, <const uint16_t *const *>ptrs, w32,
                              <int>n_in, nbytes // 2, cks if checksum else NULL, wide_ptr)
            elif itemsize == 2:
                asap_wsum_bf16(<uint16_t *>vout.buf, <const uint16_t *>vown.buf,
                               <float>w_self, <const uint16_t *const *>ptrs, w32,
                               <int>n_in, nbytes // 2, cks if checksum else NULL, wide_ptr)
            else:
                asap_wsum_f64(<double *>vout.buf, <const double *>vown.buf, w_self,
                              <const double *const *>ptrs, w64, <int>n_in, nbytes // 8,
                              cks if checksum else NULL)
        if checksum:
            return [asap_cksum_final(&cks[i], nbytes) for i in range(n_in)]
        return None
    finally:
        for i in range(got):
            PyBuffer_Release(&vins[i])
        if have_own:
            PyBuffer_Release(&vown)
        if have_out:
            PyBuffer_Release(&vout)
        free(vins); free(ptrs); free(w64); free(w32); free(cks)


def checksum(buf):
    """The checksum a writer puts in a slot footer for these bytes (never 0)."""
    cdef Py_buffer view
    cdef uint64_t value
    PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS)
    try:
        with nogil:
            value = asap_checksum(view.buf, view.len)
        return value
    finally:
        PyBuffer_Release(&view)


def _format(obj):
    fmt = memoryview(obj).format
    return fmt.lstrip("@=<")


def sleep_us(long us, long slack_ns=0):
    """One back-off sleep of `us` microseconds with timer slack `slack_ns` (0: the
    thread's own), as a wait sleeps (asap_sleep_us)."""
    if us < 0 or slack_ns < 0:
        raise ConfigError(f"sleep_us needs us >= 0 and slack_ns >= 0, got {us}, {slack_ns}")
    with nogil:
        asap_sleep_us(us, slack_ns)
