/* A watchdog for MPI calls that cannot time out.
 *
 * On a network path MPI_Win_flush returns only when the *target* has entered MPI since
 * the operation was issued.  A target that died, or that computes without calling MPI,
 * therefore blocks the flush forever, and MPI offers no way to interrupt it.  Before
 * such a call the caller arms the watchdog with a deadline and a description; a thread
 * wakes at the deadline and, if the call is still running, prints the description and
 * ends the job (MPI_Abort when MPI allows calls from another thread, else _exit, which
 * makes the process manager end the job).  Disarming is a mutex round trip.
 */
#ifndef ASAPMPI_WATCHDOG_H
#define ASAPMPI_WATCHDOG_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <mpi.h>

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started;
  long generation;     /* counts the calls armed so far */
  long armed;          /* generation of the call armed now, 0 = idle */
  struct timespec deadline;
  double seconds;
  char what[512];
  int rank;
  MPI_Comm comm;
  int can_abort;       /* MPI_THREAD_MULTIPLE */
} asap_watchdog_t;

static asap_watchdog_t asap_wd = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static int asap_ts_before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static void *asap_watchdog_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&asap_wd.mu);
  for (;;) {
    if (!asap_wd.armed) {
      pthread_cond_wait(&asap_wd.cv, &asap_wd.mu);
      continue;
    }
    long generation = asap_wd.armed;
    struct timespec deadline = asap_wd.deadline;
    int rc = 0;
    while (asap_wd.armed == generation && rc != ETIMEDOUT)
      rc = pthread_cond_timedwait(&asap_wd.cv, &asap_wd.mu, &deadline);
    if (asap_wd.armed != generation) continue;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (asap_ts_before(&now, &deadline)) continue;
    fprintf(stderr,
            "asapmpi: rank %d: %s did not complete within %g s: the target rank is dead "
            "or has not called MPI since (on network paths a one-sided operation "
            "completes only when its target enters MPI); ending the job\n",
            asap_wd.rank, asap_wd.what, asap_wd.seconds);
    fflush(stderr);
    if (asap_wd.can_abort) MPI_Abort(asap_wd.comm, 70);
    _exit(70);
  }
  return NULL;
}

/* Start the thread once per process; returns 0 or an errno value. */
static int asap_watchdog_start(void) {
  int rc = 0;
  pthread_mutex_lock(&asap_wd.mu);
  if (!asap_wd.started) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    asap_wd.can_abort = provided == MPI_THREAD_MULTIPLE;
    MPI_Comm_rank(MPI_COMM_WORLD, &asap_wd.rank);
    asap_wd.comm = MPI_COMM_WORLD;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&thread, &attr, asap_watchdog_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0) asap_wd.started = 1;
  }
  pthread_mutex_unlock(&asap_wd.mu);
  return rc;
}

/* Arm for a call that must finish within `seconds`; `what` names the call and target. */
static void asap_watchdog_arm(double seconds, const char *what) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  long whole = (long)seconds;
  deadline.tv_sec += whole;
  deadline.tv_nsec += (long)((seconds - (double)whole) * 1e9);
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&asap_wd.mu);
  asap_wd.deadline = deadline;
  asap_wd.seconds = seconds;
  strncpy(asap_wd.what, what, sizeof(asap_wd.what) - 1);
  asap_wd.what[sizeof(asap_wd.what) - 1] = 0;
  asap_wd.generation += 1;
  asap_wd.armed = asap_wd.generation;
  pthread_cond_signal(&asap_wd.cv);
  pthread_mutex_unlock(&asap_wd.mu);
}

static void asap_watchdog_disarm(void) {
  pthread_mutex_lock(&asap_wd.mu);
  asap_wd.armed = 0;
  pthread_cond_signal(&asap_wd.cv);
  pthread_mutex_unlock(&asap_wd.mu);
}

#endif /* ASAPMPI_WATCHDOG_H */
