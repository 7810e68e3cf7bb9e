# The mailbox of newest versions (included by slotwin.pyx after mailbox.pxi, whose
# allocation, pump and drain it shares; docs/PROTOCOL.md section 2e).
#
# A mailbox of newest versions (SlotWindow(newest=True): async, backup_ps, elastic)
# keeps one slot per sender that always holds the newest whole version that arrived,
# and lets no writer wait for a reader.  The reader keeps two receives per sender
# posted, into two buffers outside the window; when one completes with a version newer
# than the slot's, it and the slot trade places (the slot is a pointer, mb_cur), and
# the receive is posted again into the old slot, so a reduce never reads memory MPI may
# write.  Two receives, not one: the writer sends its next version as soon as the
# previous one was matched, before this rank's next pump reposts, and an update that
# finds no receive posted is copied into a temporary buffer inside MPI (a copy per
# update, and MPICH's heap growing by megabytes once).

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
# its receives already taken.  So a channel has at most two messages in flight: the
# first (index j of mb_busy, mb_send) and the settled one (index n_out + j).

cdef int _mbn_post(SlotWindow w, int r) except -1 nogil:
    # receive r (of in-neighbour r // 2) into its buffer, which is not the slot: nobody
    # reads it meanwhile.  mb_held orders the two receives of a sender as MPI matches
    # them (the earlier posted first), for the drain.
    cdef int i = r // 2
    w.mb_held[r] = max(w.mb_held[2 * i], w.mb_held[2 * i + 1]) + 1
    return CHKERR(MPI_Irecv(w.mb_posted[r] + HEADER_BYTES,
                            <int>(w.nbytes + MB_TRAILER_BYTES), MPI_BYTE, w._in[i], 0,
                            w.msg_comm, &w.mb_recv[r]), "MPI_Irecv")


cdef int _mbn_stamp(SlotWindow w, int r) except -1 nogil:
    # an update arrived in receive r's buffer: if newer than the slot's version (two
    # completions may be taken in either order), the buffer becomes the slot and the
    # old slot receives the next one; else the buffer receives again
    cdef int i = r // 2
    cdef char *arrived = w.mb_posted[r]
    cdef int64_t version = _mb_fill(w, i, arrived)
    if version > asap_load_i64(w.base + w.off_notify + 8 * i):
        w.mb_posted[r] = w.mb_cur[i]
        w.mb_cur[i] = arrived
        asap_store_i64(w.base + w.off_notify + 8 * i, version)
    w.mb_got[w._in[i] * (w.depth + 1)] += 1
    w.bytes_got += w.nbytes
    return _mbn_post(w, r)


cdef int _mbn_drain_sender(SlotWindow w, int i, int64_t missing, list extra) except -1:
    # At free: `missing` updates from in-neighbour i are still to come.  Its two posted
    # receives take the first two (the earlier posted first, as MPI matches them), a
    # scratch buffer each of the rest; a receive no update will match is cancelled.
    cdef int first = 2 * i if w.mb_held[2 * i] < w.mb_held[2 * i + 1] else 2 * i + 1
    cdef int second = 4 * i + 1 - first
    if missing < 2:
        with nogil:
            CHKERR(MPI_Cancel(&w.mb_recv[second]), "MPI_Cancel")
            if missing < 1:
                CHKERR(MPI_Cancel(&w.mb_recv[first]), "MPI_Cancel")
    for _ in range(missing - 2):
        extra.append((w._in[i], 0, np.empty(w.nbytes + MB_TRAILER_BYTES, np.uint8)))
    return 0


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
