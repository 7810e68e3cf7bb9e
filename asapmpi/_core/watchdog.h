/* A watchdog for MPI calls that cannot time out.
 *
 * On a network path MPI_Win_flush returns only when the *target* has entered MPI since
 * the operation was issued.  A target that died, or that computes without calling MPI,
 * therefore blocks the flush forever, and MPI offers no way to interrupt it.  Around
 * such a call the caller arms the watchdog (a handful of atomic stores: flushes are on
 * the hot path, so no lock and no wake-up) and disarms it after.  A thread checks every
 * ASAP_WATCHDOG_TICK seconds; when one armed call has lasted longer than its limit it
 * prints what the call was and to which ranks, and ends the job (MPI_Abort when MPI
 * allows calls from another thread, else _exit, after which the process manager ends
 * the job).  One watchdog per process: calls are armed by one thread at a time.
 */
#ifndef ASAPMPI_WATCHDOG_H
#define ASAPMPI_WATCHDOG_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define ASAP_WATCHDOG_TICK 0.05

typedef struct {
  const char *wait_what;    /* the wait in progress, for a crash report (NULL: none) */
  long long wait_version;
  const char *wait_ranks;
  long generation;     /* the call armed last (0: none yet) */
  long armed;          /* generation of the call running now, 0 = idle */
  long long start_ns;  /* CLOCK_MONOTONIC nanoseconds when it was armed */
  long long limit_ns;  /* its limit */
  const char *call;    /* what it is, e.g. "MPI_Win_flush_all after the put" */
  long long version;   /* the version it carries, -1 for none */
  const char *ranks;   /* "1, 3": the ranks it waits for */
  int started, rank, can_abort;
  MPI_Comm comm;
  /* >= 0: the armed call is this process's last (asap_watchdog_arm_exit): past its
   * limit the process alone ends with this exit code, the job is not aborted */
  int exit_code;
} asap_watchdog_t;

static asap_watchdog_t asap_wd;
static volatile sig_atomic_t asap_wd_reported = 0;   /* a crash/exit report was written */
static pthread_mutex_t asap_wd_start_mu = PTHREAD_MUTEX_INITIALIZER;

static long long asap_wd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *asap_watchdog_main(void *unused) {
  (void)unused;
  const struct timespec tick = {0, (long)(ASAP_WATCHDOG_TICK * 1e9)};
  for (;;) {
    nanosleep(&tick, NULL);
    /* seqlock read: the fields belong to `armed` only if it is still the call running */
    long armed = __atomic_load_n(&asap_wd.armed, __ATOMIC_ACQUIRE);
    if (!armed) continue;
    long long start = __atomic_load_n(&asap_wd.start_ns, __ATOMIC_RELAXED);
    long long limit = __atomic_load_n(&asap_wd.limit_ns, __ATOMIC_RELAXED);
    const char *call = __atomic_load_n(&asap_wd.call, __ATOMIC_RELAXED);
    long long version = __atomic_load_n(&asap_wd.version, __ATOMIC_RELAXED);
    const char *ranks = __atomic_load_n(&asap_wd.ranks, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&asap_wd.armed, __ATOMIC_RELAXED) != armed) continue;
    if (asap_wd_now_ns() - start <= limit) continue;
    double seconds = 1e-9 * (double)limit;
    if (asap_wd.exit_code >= 0) {
      fprintf(stderr, "asapmpi: rank %d: %s did not complete within %g s; this process "
              "ends with exit code %d\n", asap_wd.rank, call, seconds, asap_wd.exit_code);
      fflush(stderr);
      asap_wd_reported = 1;
      _exit(asap_wd.exit_code);
    }
    /* One write(2) of the whole line (under PIPE_BUF: the pipe to the launcher keeps it
     * whole): written in two parts, another rank's line landed between them in the
     * launcher's merged stderr and neither line read as a line. */
    char line[1024];
    int len = version >= 0
        ? snprintf(line, sizeof(line), "asapmpi: rank %d: %s of version %lld to rank(s) %s",
                   asap_wd.rank, call, version, ranks)
        : snprintf(line, sizeof(line), "asapmpi: rank %d: %s to rank(s) %s", asap_wd.rank,
                   call, ranks);
    if (len < 0) len = 0;
    int more = len < (int)sizeof(line)
        ? snprintf(line + len, sizeof(line) - (size_t)len,
                   " did not complete within %g s: the target rank is dead or has not "
                   "called MPI since (on network paths a one-sided operation completes "
                   "only when its target enters MPI); ending the job\n", seconds)
        : 0;
    if (more > 0) len += more;
    if (len >= (int)sizeof(line)) {       /* cut: still one line */
      len = (int)sizeof(line) - 1;
      line[len - 1] = '\n';
    }
    fflush(stderr);
    ssize_t ignored = write(2, line, (size_t)len);
    (void)ignored;
    asap_wd_reported = 1;     /* MPI_Abort may call exit(): no second report */
    /* The launcher forwards this rank's stderr through a pipe and kills every rank on
     * MPI_Abort: on a loaded host hydra ended the job before it forwarded the line
     * above, and the user saw exit code 70 and no reason.  A moment first. */
    struct timespec forward = {0, 200000000};
    nanosleep(&forward, NULL);
    if (asap_wd.can_abort) MPI_Abort(asap_wd.comm, 70);
    _exit(70);
  }
  return NULL;
}

/* MPI libraries end the process from inside a call that failed fatally (MPICH's
 * network module when a peer's connection drops: "OFI poll failed").  If that call was
 * an armed flush or a named wait, say which ranks it was for: the dead neighbour is
 * among them.  The handlers only format into a static buffer and write(2) it (no stdio
 * locks), report once, and then hand the signal to the handler that was installed
 * before (Python's faulthandler, a transport's backtrace printer) or the default. */
static struct sigaction asap_wd_previous[3];
static const int asap_wd_signals[3] = {SIGABRT, SIGSEGV, SIGBUS};

static void asap_watchdog_report_exit(void) {
  char line[768];
  int len = 0;
  if (asap_wd_reported) return;
  /* armed for the process's last call (asap_watchdog_arm_exit), which completed */
  if (asap_wd.exit_code >= 0) return;
  long armed = __atomic_load_n(&asap_wd.armed, __ATOMIC_ACQUIRE);
  const char *waiting = __atomic_load_n(&asap_wd.wait_what, __ATOMIC_ACQUIRE);
  if (armed) {
    const char *call = __atomic_load_n(&asap_wd.call, __ATOMIC_RELAXED);
    const char *ranks = __atomic_load_n(&asap_wd.ranks, __ATOMIC_RELAXED);
    long long version = __atomic_load_n(&asap_wd.version, __ATOMIC_RELAXED);
    len = snprintf(line, sizeof(line), "asapmpi: rank %d: the process ended inside %s "
                   "(version %lld) to rank(s) %s: MPI failed there, a dead or unreachable "
                   "rank among them\n", asap_wd.rank, call, version, ranks);
  } else if (waiting) {
    len = snprintf(line, sizeof(line), "asapmpi: rank %d: the process ended while waiting "
                   "for %s of version %lld from rank(s) %s: MPI failed there, a dead or "
                   "unreachable rank among them\n", asap_wd.rank, waiting,
                   asap_wd.wait_version, asap_wd.wait_ranks);
  }
  if (len > 0) {
    asap_wd_reported = 1;
    ssize_t ignored = write(2, line, (size_t)(len < (int)sizeof(line) ? len : (int)sizeof(line) - 1));
    (void)ignored;
  }
}

static void asap_watchdog_on_signal(int sig) {
  asap_watchdog_report_exit();
  for (int i = 0; i < 3; i++) {
    if (asap_wd_signals[i] != sig) continue;
    sigaction(sig, &asap_wd_previous[i], NULL);   /* restore, then deliver again */
  }
  raise(sig);
}

static void asap_watchdog_install_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = asap_watchdog_on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (int i = 0; i < 3; i++) sigaction(asap_wd_signals[i], &sa, &asap_wd_previous[i]);
  atexit(asap_watchdog_report_exit);
}

/* Start the thread once per process; returns 0 or an errno value. */
static int asap_watchdog_start(void) {
  int rc = 0;
  pthread_mutex_lock(&asap_wd_start_mu);
  if (!asap_wd.started) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    asap_wd.can_abort = provided == MPI_THREAD_MULTIPLE;
    MPI_Comm_rank(MPI_COMM_WORLD, &asap_wd.rank);
    asap_wd.comm = MPI_COMM_WORLD;
    asap_wd.exit_code = -1;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&thread, &attr, asap_watchdog_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0) {
      asap_wd.started = 1;
      asap_watchdog_install_handlers();
    }
  }
  pthread_mutex_unlock(&asap_wd_start_mu);
  return rc;
}

/* Arm for a call that must finish within `seconds`.  `call` and `ranks` must stay valid
 * until disarm (string literals and the window's own descriptions do). */
static inline void asap_watchdog_arm(double seconds, const char *call, long long version,
                                     const char *ranks) {
  __atomic_store_n(&asap_wd.armed, 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(&asap_wd.start_ns, asap_wd_now_ns(), __ATOMIC_RELAXED);
  __atomic_store_n(&asap_wd.limit_ns, (long long)(seconds * 1e9), __ATOMIC_RELAXED);
  __atomic_store_n(&asap_wd.call, call, __ATOMIC_RELAXED);
  __atomic_store_n(&asap_wd.version, version, __ATOMIC_RELAXED);
  __atomic_store_n(&asap_wd.ranks, ranks, __ATOMIC_RELAXED);
  asap_wd.generation += 1;
  __atomic_store_n(&asap_wd.armed, asap_wd.generation, __ATOMIC_RELEASE);
}

/* Name the wait in progress (NULL: none), for the crash report above. */
static char asap_wd_wait_ranks[256];

static inline void asap_watchdog_waiting(const char *what, long long version,
                                         const char *ranks) {
  /* `what` is a literal; the ranks are copied: the window that owns them may be freed
   * before an exit handler reads them */
  __atomic_store_n(&asap_wd.wait_what, (const char *)NULL, __ATOMIC_RELEASE);
  if (!what) return;
  asap_wd.wait_version = version;
  strncpy(asap_wd_wait_ranks, ranks ? ranks : "?", sizeof(asap_wd_wait_ranks) - 1);
  asap_wd.wait_ranks = asap_wd_wait_ranks;
  __atomic_store_n(&asap_wd.wait_what, what, __ATOMIC_RELEASE);
}

/* Arm for the process's last call (MPI_Finalize): past `seconds` the process ends with
 * `exit_code` (the watchdog thread's _exit), whatever the call is waiting for. */
static inline void asap_watchdog_arm_exit(double seconds, const char *call, int exit_code) {
  asap_wd.exit_code = exit_code;
  asap_watchdog_arm(seconds, call, -1, "");
}

static inline void asap_watchdog_disarm(void) {
  __atomic_store_n(&asap_wd.armed, 0, __ATOMIC_RELEASE);
}

#endif /* ASAPMPI_WATCHDOG_H */
