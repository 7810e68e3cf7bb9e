/* The UCX messages of Open MPI's osc ucx teardown race, filtered out during MPI_Finalize.
 *
 * Open MPI's osc ucx (4.1.x, also 5.0.x) closes its endpoints one by one in its
 * component_finalize (ucp_ep_destroy: a flush, which over UCX's TCP transport needs a
 * round trip with the peer's progress, as every endpoint that sent anything, even a
 * PUT ACK or a wire-up message, is marked to need a flush) and then destroys its UCX
 * worker, with no barrier between: the first rank through closes its sockets while
 * the others still close their endpoints to it.  Those endpoints fail (UCX's TCP
 * transport reports a peer's closed socket as "Endpoint timeout"; newer UCX as
 * "Connection reset by remote peer"), and the ucp_ep_destroy of each prints
 *     UCX  ERROR req 0x...: error during flush: Endpoint timeout, flush comp ...
 *     UCX  WARN  disconnect failed: Endpoint timeout
 * Nothing is lost: every window is freed by then (MPI_Win_free completes all RMA), and
 * UCX itself notes that it leaves the error unhandled.  Upstream added the barrier
 * (open-mpi/ompi dc68094) and reverted it the same day (bcc4851).  It happens with
 * any window, without asapmpi (an MPI_Win_allocate, some puts, MPI_Win_free), and a
 * barrier before MPI_Finalize does not help: the race is inside it.
 *
 * asap_ucx_quiet_teardown() (called at the start of MPI_Finalize, from the delete
 * callback of an attribute on MPI_COMM_SELF, and only in a process that created a
 * window) puts a log handler in front of UCX's own that drops exactly these two
 * messages, with exactly these statuses, and passes every other one on.  A no-op where
 * UCX is not loaded (Open MPI or MPICH without UCX).
 *
 * A window the program never freed (it dropped an Exchange without free()) keeps its
 * memory registered with UCX, and UCX's cleanup in MPI_Finalize then warns once per
 * registration ("object 0x... was not returned to mpool ucp_rkeys", "ucp_rcache:
 * destroying inuse region ...": a dozen lines per rank).  asapmpi has said so already,
 * in one line per rank that names the fix; once asap_ucx_leaked is set (by that line),
 * the filter drops those two warnings too.
 */
#ifndef ASAPMPI_UCX_TEARDOWN_H
#define ASAPMPI_UCX_TEARDOWN_H

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ucs_log_func_t of UCX's ucs/debug/log_def.h; returns UCS_LOG_FUNC_RC_STOP (0) or
 * UCS_LOG_FUNC_RC_CONTINUE (1) */
typedef int (*asap_ucs_log_func_t)(const char *file, unsigned line, const char *function,
                                   int level, const void *comp_conf, const char *format,
                                   va_list ap);

/* set once asapmpi reported a window it could not free (slotwin.pyx) */
static int asap_ucx_leaked = 0;

static const char *const asap_ucx_teardown_statuses[] = {
  "Endpoint timeout", "Connection reset by remote peer", NULL};

static int asap_ucx_teardown_is_race(const char *msg)
{
  const char *rest = NULL;
  const char *p;
  size_t n;
  int i;
  if (strncmp(msg, "disconnect failed: ", 19) == 0) {
    rest = msg + 19;
  } else if (strncmp(msg, "req ", 4) == 0
             && (p = strstr(msg, ": error during flush: ")) != NULL) {
    rest = p + 22;
  }
  if (rest == NULL)
    return 0;
  for (i = 0; asap_ucx_teardown_statuses[i] != NULL; i++) {
    n = strlen(asap_ucx_teardown_statuses[i]);
    if (strncmp(rest, asap_ucx_teardown_statuses[i], n) == 0
        && (rest[n] == '\0' || rest[n] == ','))
      return 1;
  }
  return 0;
}

static int asap_ucx_teardown_filter(const char *file, unsigned line, const char *function,
                                    int level, const void *comp_conf, const char *format,
                                    va_list ap)
{
  char msg[256];
  va_list copy;
  (void)file; (void)line; (void)function; (void)level; (void)comp_conf;
  if (format != NULL && asap_ucx_leaked
      && (strstr(format, "was not returned to mpool") != NULL
          || strstr(format, "destroying inuse region") != NULL))
    return 0;
  if (format == NULL || (strstr(format, "error during flush") == NULL
                         && strstr(format, "disconnect failed") == NULL))
    return 1;
  va_copy(copy, ap);
  vsnprintf(msg, sizeof msg, format, copy);
  va_end(copy);
  return asap_ucx_teardown_is_race(msg) ? 0 : 1;
}

/* 1 if the filter is now in front of UCX's log handlers, 0 where UCX is not loaded */
static int asap_ucx_quiet_teardown(void)
{
  static int installed = 0;
  void *ucs;
  void (*push)(asap_ucs_log_func_t);
  if (installed)
    return 1;
  /* only a libucs this process already loaded; the handle stays open, so the library
   * (and its list of handlers) outlives MPI's unloading of its components */
  ucs = dlopen("libucs.so.0", RTLD_NOW | RTLD_NOLOAD);
  if (ucs == NULL)
    return 0;
  *(void **)(&push) = dlsym(ucs, "ucs_log_push_handler");
  if (push == NULL)
    return 0;
  push(asap_ucx_teardown_filter);
  installed = 1;
  return 1;
}

#endif
