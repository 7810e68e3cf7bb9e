# Error checking shared by the core modules: every MPI call is wrapped as
#     with nogil: CHKERR(MPI_Xxx(...), "MPI_Xxx")
# CHKERR takes the GIL only to raise, so hot loops stay nogil.

from asapmpi.errors import mpi_error as _mpi_error_of


cdef object _mpi_error(int ierr, const char *call):
    cdef char text[MPI_MAX_ERROR_STRING + 1]
    cdef int n = 0
    if MPI_Error_string(ierr, text, &n) != MPI_SUCCESS:
        n = 0
    # a ProcessFailedError where the error class says a process died (ULFM)
    return _mpi_error_of(ierr, call.decode(), text[:n].decode(errors="replace"))


cdef inline int CHKERR(int ierr, const char *call) except -1 nogil:
    if ierr == MPI_SUCCESS:
        return 0
    with gil:
        raise _mpi_error(ierr, call)


cdef inline int CHKSOME(int ierr, int n, int count, MPI_Status *statuses,
                        const char *call) except -1 nogil:
    # MPI_Testsome over `n` requests: MPI_ERR_IN_STATUS says that a request failed, and
    # its status says how; raise that error (a process failure is then the
    # ProcessFailedError it is, not an MPIError of class MPI_ERR_IN_STATUS).  The
    # completed requests' statuses first; then every request's: Open MPI's ULFM
    # returns MPI_ERR_IN_STATUS with no request completed when an MPI_ANY_SOURCE
    # receive cannot complete for a failed process, its status saying
    # MPI_ERR_PROC_FAILED_PENDING
    cdef int k
    cdef int found = MPI_SUCCESS
    if ierr == MPI_SUCCESS:
        return 0
    if ierr == MPI_ERR_IN_STATUS:
        for k in range(count if count != MPI_UNDEFINED and count > 0 else 0):
            if statuses[k].MPI_ERROR != MPI_SUCCESS and \
                    statuses[k].MPI_ERROR != MPI_ERR_PENDING:
                found = statuses[k].MPI_ERROR
                break
        if found == MPI_SUCCESS:
            for k in range(n):
                if statuses[k].MPI_ERROR != MPI_SUCCESS and \
                        statuses[k].MPI_ERROR != MPI_ERR_PENDING:
                    found = statuses[k].MPI_ERROR
                    break
        if found != MPI_SUCCESS:
            ierr = found
    with gil:
        raise _mpi_error(ierr, call)


cdef extern from "kernels.h" nogil:
    ctypedef struct asap_cksum_t:
        pass
    int64_t asap_load_i64(const void *p)
    void asap_store_i64(void *p, int64_t v)
    void asap_fence()
    void asap_copy_out(void *dst, const void *src, size_t n)
    double asap_now()
    void asap_backoff(long polls, long yield_polls, long max_sleep_us, long slack_ns)
    void asap_sleep_us(long us, long slack_ns)
    void asap_cksum_init(asap_cksum_t *c)
    uint64_t asap_cksum_final(const asap_cksum_t *c, size_t n)
    uint64_t asap_checksum(const void *p, size_t n)
    void asap_wsum_f32(float *out, const float *own, float w0, const float *const *ins,
                       const float *ws, int n_in, size_t n, asap_cksum_t *cks)
    void asap_wsum_f64(double *out, const double *own, double w0, const double *const *ins,
                       const double *ws, int n_in, size_t n, asap_cksum_t *cks)
    void asap_wsum_bf16(uint16_t *out, const uint16_t *own, float w0,
                        const uint16_t *const *ins, const float *ws, int n_in, size_t n,
                        asap_cksum_t *cks, float *wide)
    void asap_wsum_f16(uint16_t *out, const uint16_t *own, float w0,
                        const uint16_t *const *ins, const float *ws, int n_in, size_t n,
                        asap_cksum_t *cks, float *wide)
