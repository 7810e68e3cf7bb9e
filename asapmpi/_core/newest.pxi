# The mailbox of newest versions (included by slotwin.pyx after mailbox.pxi, whose
# allocation, pump and drain it shares; docs/PROTOCOL.md section 2e).
#
# A mailbox of newest versions (SlotWindow(newest=True): async, backup_ps, elastic)
# keeps one slot per sender that always holds the newest whole version that arrived,
# and lets no writer wait for a reader.  The reader's receive goes into a second buffer per sender;
# when it completes, the two trade places (the slot is a pointer, mb_cur) and the
# receive is posted again into the other, so a reduce never reads memory MPI may
# write.
#
# A writer sends with MPI_Issend, which completes only once the reader's receive took
# the message, and a put sends to a reader only when the channel to it is free (no
# message in flight): an update the reader has not taken never piles up behind
# another at a reader that stopped calling MPI.  A put while the channel is busy does
# not wait: the channel is marked waiting, and the writer's next pump sends the newest
# version once the channel is free (the versions in between are never sent).
#
# Before this rank waits outside its windows (asapmpi's collectives, free():
# _settle_all with deliver), a waiting channel gets the newest version at once, as a
# second message in flight beside the busy one: a reader still stepping (a slow worker
# a backup_ps server left behind) must not wait for a writer that no longer pumps.
# Settling never waits for a reader, which may itself be in a blocking collective with
# its receive already taken.  So a channel has at most two messages in flight: the
# first (index j of mb_busy, mb_send) and the settled one (index n_out + j).

cdef int _mbn_post(SlotWindow w, int i) except -1 nogil:
    # the receive into the buffer that is not the slot: nobody reads it meanwhile
    return CHKERR(MPI_Irecv(w.mb_posted[i] + HEADER_BYTES,
                            <int>(w.nbytes + MB_TRAILER_BYTES), MPI_BYTE, w._in[i], 0,
                            w.msg_comm, &w.mb_recv[i]), "MPI_Irecv")


cdef int _mbn_stamp(SlotWindow w, int i) except -1 nogil:
    # the update arrived in the posted buffer: it becomes the slot, the old slot
    # receives the next one
    cdef char *arrived = w.mb_posted[i]
    cdef int64_t version = _mb_fill(w, i, arrived)
    w.mb_posted[i] = w.mb_cur[i]
    w.mb_cur[i] = arrived
    asap_store_i64(w.base + w.off_notify + 8 * i, version)
    w.mb_got[w._in[i] * (w.depth + 1)] += 1
    w.bytes_got += w.nbytes
    return _mbn_post(w, i)


cdef int _mbn_send(SlotWindow w, int j, int second) except -1 nogil:
    # the newest stage to out-neighbour j, as its first or second message in flight
    cdef int s = w.mb_newest_stage
    cdef int k = second * w.n_out + j
    CHKERR(MPI_Issend(w.mb_stage + s * w.mb_stage_stride,
                      <int>(w.nbytes + MB_TRAILER_BYTES), MPI_BYTE, w._out[j], 0,
                      w.msg_comm, &w.mb_send[k]), "MPI_Issend")
    w.mb_busy[k] = s
    w.mb_refs[s] += 1
    w.mb_waiting[j] = 0
    w.mb_sent[w._out[j] * (w.depth + 1)] += 1
    w.bytes_put += w.nbytes
    return 0


cdef int _mbn_complete_sends(SlotWindow w, bint send_waiting) except -1 nogil:
    # free the messages a reader took; send the newest version into the channels that
    # waited for it and are free now
    cdef int j, k
    cdef int flag = 0
    for k in range(2 * w.n_out):
        if w.mb_busy[k] >= 0:
            CHKERR(MPI_Test(&w.mb_send[k], &flag, MPI_STATUS_IGNORE), "MPI_Test")
            if flag:
                w.mb_refs[w.mb_busy[k]] -= 1
                w.mb_busy[k] = -1
    if send_waiting:
        for j in range(w.n_out):
            if w.mb_waiting[j] and w.mb_busy[j] < 0 and w.mb_busy[w.n_out + j] < 0:
                _mbn_send(w, j, 0)
    return 0


cdef int _mbn_put(SlotWindow w, const char *src, int64_t version, int64_t iteration,
                  bint checksum) except -1 nogil:
    # The update into a stage no send reads, then to every reader whose channel is free;
    # the others get it (or a newer one) from _mb_pump once theirs is.
    cdef int s = 0
    cdef int j
    _mbn_complete_sends(w, False)
    # found: at most 2 n_out stages have a send in flight and one more is the newest
    while w.mb_refs[s] != 0 or s == w.mb_newest_stage:
        s += 1
    _mb_fill_stage(w, s, src, version, iteration, checksum)
    w.mb_newest_stage = s
    for j in range(w.n_out):
        w.mb_waiting[j] = 0
        if w.skip[j]:
            continue
        if w.mb_busy[j] >= 0 or w.mb_busy[w.n_out + j] >= 0:
            w.mb_waiting[j] = 1
        else:
            _mbn_send(w, j, 0)
    w._sent = version
    return 0


cdef int _mbn_settle(SlotWindow w) except -1 nogil:
    # before waiting outside the windows: every waiting channel gets the newest now
    cdef int j
    _mb_pump(w)
    for j in range(w.n_out):
        if w.mb_waiting[j]:
            if w.mb_busy[j] < 0:
                _mbn_send(w, j, 0)
            elif w.mb_busy[w.n_out + j] < 0:
                _mbn_send(w, j, 1)
    return 0


cdef void _note_newest(SlotWindow w) noexcept nogil:
    global _n_newest
    if _n_newest < MAX_PENDING:     # else the window's own waits still deliver them
        _newest_win[_n_newest] = <PyObject *>w
        _n_newest += 1


cdef void _forget_newest(SlotWindow w) noexcept nogil:
    global _n_newest
    cdef int i
    for i in range(_n_newest):
        if _newest_win[i] == <PyObject *>w:
            _n_newest -= 1
            _newest_win[i] = _newest_win[_n_newest]
            return


cdef int _settle_newest(bint deliver) except -1 nogil:
    cdef int i
    for i in range(_n_newest):
        with gil:
            if deliver:
                _mbn_settle(<SlotWindow>_newest_win[i])
            else:
                _mb_pump(<SlotWindow>_newest_win[i])
    return 0
