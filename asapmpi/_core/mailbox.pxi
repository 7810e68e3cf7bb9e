# The mailbox: a SlotWindow whose slots and ack words are fed by two-sided messages
# (included by slotwin.pyx; docs/PROTOCOL.md section 2d).
#
# Policies that wait on window words (Hop's rotating update slots and token counters,
# BSP's slots) run unchanged over it: put() copies the update into one of its staging
# buffers, followed by a 32-byte trailer laid out as a footer (version,
# checksum, iteration), and sends that as one message per out-neighbour, tagged with
# the slot index version % depth; ack(c) sends the token c to every in-neighbour.  The
# reader keeps one receive posted per (in-neighbour, slot) and one per out-neighbour's
# tokens.
# Every wait of the window pumps them (_mb_pump, from _progress): a completed update is
# stamped into its slot's header, footer and notify word exactly as a put would have
# written them, a token raises the local ack word, so the verified reduce and every wait
# read the same words on every transport.
#
# Why it is safe: a slot's receive (payload and trailer, into the slot's payload and
# the footer after it) is posted only while no reader may take the slot (its words say
# "never written"), and reposted once this rank released the version it holds:
# ack(c) reposts every slot holding a version <= c - retain (Hop: retain is the
# staleness bound, c + 1 - retain the oldest version iteration c + 1 may still reduce),
# release(c) every slot holding a version <= c (BSP, after its reduce).  A writer sends
# version k into slot k % depth only after the token bound let it enter iteration k, by
# which time the reader has released the slot's previous version; a message that
# arrives earlier waits at the MPI layer, never in the slot.

cdef enum:
    # trailer of an update message, after its payload: version, checksum (the footer's
    # first two words), iteration, spare
    MB_TRAILER = 4
    MB_TRAILER_BYTES = 32
    # the tag of token messages (slot tags are 0 .. depth - 1)
    MB_TOKEN_TAG = 32767


cdef int _mb_alloc(SlotWindow w) except -1:
    cdef int n = max(w.n_in, 1)
    cdef int m = max(w.n_out, 1)
    cdef int k
    # newest versions: two receives per in-neighbour (newest.pxi)
    w.mb_nrecv = 2 * w.n_in if w.newest else w.n_in * w.depth
    w.mb_recv = <MPI_Request *>calloc(max(w.mb_nrecv, 1), sizeof(MPI_Request))
    w.mb_held = <int64_t *>calloc(max(w.mb_nrecv, 1), sizeof(int64_t))
    w.mb_index = <int *>calloc(max(w.mb_nrecv, m), sizeof(int))
    # One staging buffer per version the token bound lets a writer have in flight to
    # one reader (depth, at least 2): a reader that stops calling MPI (a straggler that
    # backup workers tolerate) holds up its writer's stages no sooner than Hop's tokens
    # hold up the writer itself.
    w.mb_stages = max(2, w.depth)
    w.tok_recv = <MPI_Request *>calloc(m, sizeof(MPI_Request))
    w.tok_in = <int64_t *>calloc(m, sizeof(int64_t))
    w.tok_send = <MPI_Request *>calloc(n, sizeof(MPI_Request))
    w.tok_out = <int64_t *>calloc(n, sizeof(int64_t))
    w.tok_next = <int64_t *>calloc(n, sizeof(int64_t))
    if w.newest:
        # at most two sends in flight per out-neighbour (_mbn_send), each from any
        # stage, and the newest: one more stage is always free
        w.mb_stages = 2 * m + 2
        w.mb_cur = <char **>calloc(n, sizeof(char *))
        w.mb_posted = <char **>calloc(2 * n, sizeof(char *))
        w.mb_spare = <char *>calloc(2 * n, w.slot_stride)
        w.mb_busy = <int *>calloc(2 * m, sizeof(int))
        w.mb_refs = <int *>calloc(w.mb_stages, sizeof(int))
        w.mb_waiting = <char *>calloc(m, 1)
        if (w.mb_cur == NULL or w.mb_posted == NULL or w.mb_spare == NULL
                or w.mb_busy == NULL or w.mb_refs == NULL or w.mb_waiting == NULL):
            raise MemoryError()
        for k in range(2 * m):
            w.mb_busy[k] = -1
        w.mb_newest_stage = -1
    w.mb_send = <MPI_Request *>calloc(w.mb_stages * m, sizeof(MPI_Request))
    w.mb_stage_stride = (w.nbytes + MB_TRAILER_BYTES + 63) // 64 * 64
    w.mb_stage = <char *>calloc(w.mb_stages, w.mb_stage_stride)
    w.mb_stage_version = <int64_t *>calloc(w.mb_stages, sizeof(int64_t))
    w.mb_sent = <int64_t *>calloc(w.size * (w.depth + 1), sizeof(int64_t))
    w.mb_got = <int64_t *>calloc(w.size * (w.depth + 1), sizeof(int64_t))
    if (w.mb_recv == NULL or w.mb_stage == NULL or w.mb_held == NULL
            or w.mb_stage_version == NULL
            or w.mb_index == NULL or w.mb_send == NULL or w.tok_recv == NULL
            or w.tok_in == NULL or w.tok_send == NULL or w.tok_out == NULL
            or w.tok_next == NULL or w.mb_sent == NULL or w.mb_got == NULL):
        raise MemoryError()
    for k in range(max(w.mb_nrecv, 1)):
        w.mb_recv[k] = MPI_REQUEST_NULL
    for k in range(w.mb_stages * m):
        w.mb_send[k] = MPI_REQUEST_NULL
    for k in range(m):
        w.tok_recv[k] = MPI_REQUEST_NULL
    for k in range(n):
        w.tok_send[k] = MPI_REQUEST_NULL
    return 0


cdef void _mb_free_arrays(SlotWindow w) noexcept:
    free(w.mb_recv); w.mb_recv = NULL
    free(w.mb_stage); w.mb_stage = NULL
    free(w.mb_stage_version); w.mb_stage_version = NULL
    free(w.mb_held); w.mb_held = NULL
    free(w.mb_index); w.mb_index = NULL
    free(w.mb_send); w.mb_send = NULL
    free(w.tok_recv); w.tok_recv = NULL
    free(w.tok_in); w.tok_in = NULL
    free(w.tok_send); w.tok_send = NULL
    free(w.tok_out); w.tok_out = NULL
    free(w.tok_next); w.tok_next = NULL
    free(w.mb_sent); w.mb_sent = NULL
    free(w.mb_got); w.mb_got = NULL
    free(w.mb_cur); w.mb_cur = NULL
    free(w.mb_posted); w.mb_posted = NULL
    free(w.mb_spare); w.mb_spare = NULL
    free(w.mb_busy); w.mb_busy = NULL
    free(w.mb_refs); w.mb_refs = NULL
    free(w.mb_waiting); w.mb_waiting = NULL


cdef int _mb_start(SlotWindow w) except -1 nogil:
    # every slot free, every out-neighbour's tokens awaited
    cdef int i, s, j
    for i in range(w.n_in):
        if w.newest:
            # the window's slot says "never written" until the first version arrives
            # in a spare buffer and the two trade places
            w.mb_cur[i] = w.base + w.off_slots + i * w.slot_stride
            for s in range(2):
                w.mb_posted[2 * i + s] = w.mb_spare + (2 * i + s) * w.slot_stride
                _mbn_post(w, 2 * i + s)
            continue
        for s in range(w.depth):
            _mb_post_slot(w, i, s)
    if w.newest:
        _note_newest(w)
    for j in range(w.n_out):
        _mb_post_token(w, j)
    return 0


cdef int _mb_post_slot(SlotWindow w, int i, int s) except -1 nogil:
    # The slot is about to be written by MPI: no reader may take it until _mb_stamp.
    # Notify word, header and footer say version 0, "never written": a wait does not
    # take it, a reduce counts it stale and skips it.
    cdef int idx = i * w.depth + s
    cdef char *hdr = w._slot(i, s)
    asap_store_i64(w.base + w.off_notify + 8 * idx, 0)
    asap_store_i64(hdr, 0)
    asap_store_i64(hdr + HEADER_BYTES + w.payload_stride, 0)
    asap_fence()
    # payload and trailer in one message: the trailer lands in the payload's padding or
    # the footer (at least MB_TRAILER_BYTES follow the payload in every slot)
    CHKERR(MPI_Irecv(hdr + HEADER_BYTES, <int>(w.nbytes + MB_TRAILER_BYTES), MPI_BYTE,
                     w._in[i], s, w.msg_comm, &w.mb_recv[idx]), "MPI_Irecv")
    w.mb_held[idx] = 0
    return 0


cdef int _mb_post_token(SlotWindow w, int j) except -1 nogil:
    return CHKERR(MPI_Irecv(&w.tok_in[j], 1, MPI_INT64_T, w._out[j], MB_TOKEN_TAG,
                            w.msg_comm, &w.tok_recv[j]), "MPI_Irecv")


cdef int64_t _mb_fill(SlotWindow w, int i, char *hdr) noexcept nogil:
    # An update arrived in the buffer at `hdr`: write its header and footer from the
    # trailer as a put would have (footer before header), so every reader's checks see
    # a whole version or none; returns the version.
    cdef char *ftr = hdr + HEADER_BYTES + w.payload_stride
    cdef int64_t t[MB_TRAILER]
    asap_fence()
    memcpy(t, hdr + HEADER_BYTES + w.nbytes, MB_TRAILER_BYTES)   # 4-byte aligned only
    asap_store_i64(ftr + 8, t[1])
    asap_store_i64(ftr, t[0])
    asap_store_i64(hdr + 8, t[2])
    asap_store_i64(hdr + 16, w._in[i])
    asap_store_i64(hdr + 24, w.nbytes)
    asap_store_i64(hdr, t[0])
    asap_fence()
    return t[0]


cdef int _mb_stamp(SlotWindow w, int idx) except -1 nogil:
    # An update arrived in its slot: its words, then the notify word (after the
    # header, so a wait that sees the notify reads a whole version).
    cdef int i = idx // w.depth
    cdef int64_t version = _mb_fill(w, i, w._slot(i, idx % w.depth))
    asap_store_i64(w.base + w.off_notify + 8 * idx, version)
    w.mb_held[idx] = version if version > 0 else 1
    w.mb_got[w._in[i] * (w.depth + 1) + idx % w.depth] += 1
    w.bytes_got += w.nbytes
    return 0


cdef int _mb_pump(SlotWindow w) except -1 nogil:
    # Complete what arrived: updates into their slots, tokens into the ack words; send
    # the tokens that waited for an earlier one to leave.
    cdef int count = 0
    cdef int k, idx, j
    cdef int64_t *ack
    if w.n_in:
        CHKERR(MPI_Testsome(w.mb_nrecv, w.mb_recv, &count, w.mb_index,
                            MPI_STATUSES_IGNORE), "MPI_Testsome")
        if count != MPI_UNDEFINED:
            for k in range(count):
                if w.newest:
                    _mbn_stamp(w, w.mb_index[k])
                else:
                    _mb_stamp(w, w.mb_index[k])
    if w.newest:
        _mbn_complete_sends(w, True)
    if w.n_out:
        count = 0
        CHKERR(MPI_Testsome(w.n_out, w.tok_recv, &count, w.mb_index, MPI_STATUSES_IGNORE),
               "MPI_Testsome")
        if count != MPI_UNDEFINED:
            for k in range(count):
                j = w.mb_index[k]
                w.mb_got[w._out[j] * (w.depth + 1) + w.depth] += 1
                ack = <int64_t *>(w.base + w.off_ack + 8 * j)
                # tokens of one sender arrive in order; max() keeps a word that only grows
                if w.tok_in[j] > asap_load_i64(ack):
                    asap_store_i64(ack, w.tok_in[j])
                _mb_post_token(w, j)
    _mb_send_tokens(w)
    return 0


cdef int _mb_send_tokens(SlotWindow w) except -1 nogil:
    # One token in flight per in-neighbour; a newer one waits in tok_next (tokens are
    # counters: the newest says everything the older ones did).
    cdef int i
    cdef int flag = 0
    for i in range(w.n_in):
        if w.tok_next[i] <= 0:
            continue
        if w.tok_send[i] != MPI_REQUEST_NULL:
            CHKERR(MPI_Test(&w.tok_send[i], &flag, MPI_STATUS_IGNORE), "MPI_Test")
            if not flag:
                continue
        w.tok_out[i] = w.tok_next[i]
        w.tok_next[i] = 0
        CHKERR(MPI_Isend(&w.tok_out[i], 1, MPI_INT64_T, w._in[i], MB_TOKEN_TAG, w.msg_comm,
                         &w.tok_send[i]), "MPI_Isend")
        w.mb_sent[w._in[i] * (w.depth + 1) + w.depth] += 1
    return 0


cdef int _mb_ack(SlotWindow w, int64_t completed) except -1 nogil:
    # Hop's token: `completed` iterations done; then release the slots no later
    # iteration reads (a version <= completed - retain), so their writers may refill them.
    cdef int i
    for i in range(w.n_in):
        if completed > w.tok_next[i]:
            w.tok_next[i] = completed
    _mb_send_tokens(w)
    _mb_release(w, completed - w.retain)
    return 0


cdef int _mb_release(SlotWindow w, int64_t upto) except -1 nogil:
    # repost the receive of every slot holding a version <= upto (a mailbox of newest
    # versions reposts as updates arrive: nothing to release)
    cdef int idx
    if w.newest:
        return 0
    for idx in range(w.n_in * w.depth):
        if 0 < w.mb_held[idx] <= upto:
            _mb_post_slot(w, idx // w.depth, idx % w.depth)
    return 0


cdef int _mb_fill_stage(SlotWindow w, int stage, const char *src, int64_t version,
                        int64_t iteration, bint checksum) except -1 nogil:
    # the update's payload and its trailer (version, checksum, iteration) into `stage`
    cdef char *buf = w.mb_stage + stage * w.mb_stage_stride
    cdef int64_t t[MB_TRAILER]
    t[0] = version
    t[1] = <int64_t>asap_checksum(src, w.nbytes) if checksum else 0
    t[2] = iteration
    t[3] = 0
    memcpy(buf, src, w.nbytes)
    memcpy(buf + w.nbytes, t, MB_TRAILER_BYTES)
    w.mb_stage_version[stage] = version
    return 0


cdef int _mb_send(SlotWindow w, int stage, const char *src, int64_t version,
                  int64_t iteration, bint checksum) except -1 nogil:
    # The update: one copy into `stage` (whose earlier sends completed), then one
    # message per out-neighbour not skipped (suppressed).
    cdef int j
    cdef int tag = <int>(version % w.depth)
    cdef char *buf = w.mb_stage + stage * w.mb_stage_stride
    _mb_fill_stage(w, stage, src, version, iteration, checksum)
    w.mb_stage_next = (stage + 1) % w.mb_stages
    for j in range(w.n_out):
        if w.skip[j]:
            continue
        CHKERR(MPI_Isend(buf, <int>(w.nbytes + MB_TRAILER_BYTES), MPI_BYTE, w._out[j], tag,
                         w.msg_comm, &w.mb_send[stage * w.n_out + j]), "MPI_Isend")
        w.mb_sent[w._out[j] * (w.depth + 1) + tag] += 1
        w.bytes_put += w.nbytes
    w._sent = version
    return 0


cdef int _mb_wait_stage(SlotWindow w, int stage, double timeout) except -1 nogil:
    # 1 on timeout; the sends from `stage` complete once each receiver has posted the
    # slot's receive (and, above the eager limit, taken the message)
    cdef long polls = 0
    cdef double t0 = asap_now()
    cdef int j
    cdef int flag = 0
    cdef bint done
    while True:
        done = True
        for j in range(w.n_out):
            if w.mb_send[stage * w.n_out + j] != MPI_REQUEST_NULL:
                CHKERR(MPI_Test(&w.mb_send[stage * w.n_out + j], &flag, MPI_STATUS_IGNORE),
                       "MPI_Test")
                if not flag:
                    done = False
        if done:
            return 0
        if w._idle(&polls, t0, timeout):
            return 1


cdef int _mb_drain(SlotWindow w) except -1:
    # At free (collective): every message sent to this rank is received (into the slot
    # it was meant for, or a scratch buffer once the slot holds an unreleased version)
    # and every receive no message will match is cancelled, so that no message outlives
    # the communicator.  The counts of messages sent, per sender and tag, come by
    # MPI_Alltoall.
    cdef int width = w.depth + 1
    cdef int64_t *sent_to_me = <int64_t *>calloc(w.size * width, sizeof(int64_t))
    cdef int i, s, j, idx, r
    cdef int64_t missing
    if sent_to_me == NULL:
        raise MemoryError()
    extra = []
    try:
        with nogil:
            # every rank came to free(): what follows completes unless a rank dies now,
            # and the watchdog ends the job then instead of a hang
            asap_watchdog_arm(w.flush_timeout, b"the mailbox's drain at free()", -1,
                              w.nbr_desc)
            _mb_send_tokens(w)      # tokens still waiting go too: they are counted
            CHKERR(MPI_Alltoall(w.mb_sent, width, MPI_INT64_T, sent_to_me, width,
                                MPI_INT64_T, w.comm), "MPI_Alltoall")
        for i in range(w.n_in):
            if w.newest:
                _mbn_drain_sender(w, i, sent_to_me[w._in[i] * width]
                                  - w.mb_got[w._in[i] * width], extra)
                continue
            for s in range(w.depth):
                idx = i * w.depth + s
                missing = sent_to_me[w._in[i] * width + s] - w.mb_got[w._in[i] * width + s]
                if w.mb_held[idx] == 0:
                    if missing > 0:
                        missing -= 1        # the posted receive takes the first
                    else:
                        with nogil:
                            CHKERR(MPI_Cancel(&w.mb_recv[idx]), "MPI_Cancel")
                for _ in range(missing):
                    extra.append((w._in[i], s,
                                  np.empty(w.nbytes + MB_TRAILER_BYTES, np.uint8)))
        for j in range(w.n_out):
            missing = (sent_to_me[w._out[j] * width + w.depth]
                       - w.mb_got[w._out[j] * width + w.depth])
            if missing > 0:
                missing -= 1
            else:
                with nogil:
                    CHKERR(MPI_Cancel(&w.tok_recv[j]), "MPI_Cancel")
            for _ in range(missing):
                extra.append((w._out[j], MB_TOKEN_TAG, np.empty(1, np.int64)))
        requests = [_mb_irecv_scratch(w, buf, peer, tag) for peer, tag, buf in extra]
        with nogil:
            for r in range(w.mb_nrecv):
                CHKERR(MPI_Wait(&w.mb_recv[r], MPI_STATUS_IGNORE), "MPI_Wait")
            for r in range(w.n_out):
                CHKERR(MPI_Wait(&w.tok_recv[r], MPI_STATUS_IGNORE), "MPI_Wait")
            for r in range(w.mb_stages * w.n_out):
                CHKERR(MPI_Wait(&w.mb_send[r], MPI_STATUS_IGNORE), "MPI_Wait")
            for r in range(w.n_in):
                CHKERR(MPI_Wait(&w.tok_send[r], MPI_STATUS_IGNORE), "MPI_Wait")
        for req in requests:
            req.Wait()
    finally:
        asap_watchdog_disarm()      # also when an MPI call failed: no stale deadline
        free(sent_to_me)
    return 0


cdef object _mb_irecv_scratch(SlotWindow w, buf, int peer, int tag):
    # a receive into a scratch NumPy buffer (uint8: an update, int64: a token, the type
    # it was sent as), as an mpi4py request the drain waits on
    cdef MPI.Request req = MPI.Request()
    cdef Py_buffer view
    cdef MPI_Datatype kind = MPI_BYTE if buf.dtype == np.uint8 else MPI_INT64_T
    PyObject_GetBuffer(buf, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        CHKERR(MPI_Irecv(view.buf, <int>(view.len if kind == MPI_BYTE else view.len // 8),
                         kind, peer, tag, w.msg_comm, &req.ob_mpi), "MPI_Irecv")
    finally:
        PyBuffer_Release(&view)
    return req
