"""Runtime configuration: one object, documented defaults, environment overrides.

Every environment variable asapmpi reads is named here and read once, at import.
Unknown keys are refused so that a typo does not silently keep a default.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from .errors import ConfigError
from .options import Option

#: environment variable -> rc field
ENVIRONMENT = {
    "ASAPMPI_TIMEOUT": "timeout",
    "ASAPMPI_TIMEOUT_MIN": "timeout_min",
    "ASAPMPI_TIMEOUT_FACTOR": "timeout_factor",
    "ASAPMPI_TIMEOUT_STARTUP": "timeout_startup",
    "ASAPMPI_ABORT_ON_ERROR": "abort_on_error",
    "ASAPMPI_SWEEP_SHM": "sweep_shm",
    "ASAPMPI_POLL_YIELDS": "poll_yields",
    "ASAPMPI_POLL_MAX_SLEEP_US": "poll_max_sleep_us",
    "ASAPMPI_POLL_TIMER_SLACK_NS": "poll_timer_slack_ns",
    "ASAPMPI_MAX_TRANSFER": "max_transfer",
    "ASAPMPI_TRACE_ITERATIONS": "trace_iterations",
    "ASAPMPI_DEVICE_REDUCE": "device_reduce",
}

#: MPICH's active-message RMA (MPIR_CVAR_CH4_OFI_ENABLE_RMA=0) crashes (MPICH 5.0.2,
#: libfabric tcp, 3+ ranks) on puts of 16 KB and more; below this they work
#: (dev/repro/mpich_am_rma_large_put.py)
AM_RMA_MAX_TRANSFER = 16000


@dataclass
class RC:
    """Defaults for every Exchange; change them with ``asapmpi.rc.timeout = ...``.

    timeout: the longest a wait on a neighbour may last (seconds) before
        NeighbourTimeoutError; an Exchange created without timeout= starts with it and,
        once it has timed STEPS_MEASURED steps, waits timeout_factor times its median
        step time, at least timeout_min and at most timeout (ASAP section 5: a timeout
        that is a function of the reduce time).
    timeout_min: the floor of that derived timeout, seconds.
    timeout_factor: how many median steps a wait may last.
    timeout_startup: the deadline of collectives that ranks may reach far apart: those
        that start a training run (the ranks may need a while to read their data) and
        free() under policies that let ranks drift apart (hop, async, gossip, the
        parameter servers: a slow rank may have many steps left), seconds; at least
        `timeout`.
    abort_on_error: an uncaught exception in a job of several ranks calls MPI_Abort
        (asapmpi.launch.faults), so that a failing rank ends the job instead of hanging it.
    sweep_shm: the first Exchange of a job removes, on each host, the shared-memory
        files that earlier jobs of this user left in /dev/shm when they were aborted or
        killed and that no process uses (asapmpi.launch.shm_leftovers.sweep_at_start).
    poll_yields: unsuccessful polls answered with sched_yield before sleeping.
    poll_max_sleep_us: longest sleep between two polls, microseconds.
    poll_timer_slack_ns: how far past its deadline the kernel may end such a sleep
        (Linux's timer slack), nanoseconds.  0: automatic (asapmpi.launch.cores): 1 us where
        every rank of a host has a core of its own, 50 us (Linux's default) where the
        ranks oversubscribe the cores.
    max_transfer: the largest single MPI_Put/MPI_Get of a payload, bytes; larger
        payloads go in pieces.  0: automatic, AM_RMA_MAX_TRANSFER when MPICH runs RMA
        as active messages (MPIR_CVAR_CH4_OFI_ENABLE_RMA=0), else 1 GiB.
    trace_iterations: how many of the newest iterations the policies keep in memory
        (iteration entry times, reduced versions, pulls, supersteps: `Exchange.trace`);
        older ones are dropped, so memory stays flat over any number of steps.  An
        Exchange with trace_file= streams every iteration to the file besides.
    device_reduce: a device buffer (asapmpi.device) is reduced on the device, from
        copies of the verified slots (policies whose reduce ends their receive:
        Policy.reduces_last, without checksum=); false: on the host, then copied back.
    """

    timeout: float = 60.0
    timeout_min: float = 10.0
    timeout_factor: float = 100.0
    timeout_startup: float = 300.0
    abort_on_error: bool = True
    sweep_shm: bool = True
    poll_yields: int = 32
    poll_max_sleep_us: int = 100
    poll_timer_slack_ns: int = 0
    max_transfer: int = 0
    trace_iterations: int = 10000
    device_reduce: bool = True

    def __setattr__(self, name, value):
        known = {f.name: f.type for f in fields(self)}
        if name not in known:
            raise ConfigError(f"asapmpi.rc has no option {name!r}; known: {sorted(known)}")
        if name in ("abort_on_error", "sweep_shm", "device_reduce"):
            if not isinstance(value, bool):
                # the words every boolean option takes (ASAPMPI_ABORT_ON_ERROR=maybe is
                # refused, not taken for true)
                value = Option(name, bool, True).convert("asapmpi.rc", value)
            object.__setattr__(self, name, value)
            return
        value = float(value) if name.startswith("timeout") else int(value)
        may_be_zero = name in ("poll_yields", "max_transfer", "poll_timer_slack_ns")
        if (value <= 0 and not may_be_zero) or value < 0 or value != value \
                or value == float("inf"):
            raise ConfigError(f"asapmpi.rc.{name} must be positive and finite, got {value}")
        object.__setattr__(self, name, value)


def max_transfer() -> int:
    """The payload piece size in bytes that rc.max_transfer asks for (0: automatic)."""
    if rc.max_transfer:
        return rc.max_transfer
    from .launch.ranks import active_message_rma

    if active_message_rma():
        return AM_RMA_MAX_TRANSFER
    return 1 << 30


def _from_environment() -> RC:
    rc = RC()
    for var, name in ENVIRONMENT.items():
        if var in os.environ:
            try:
                setattr(rc, name, os.environ[var])
            except ValueError as exc:
                raise ConfigError(f"{var}={os.environ[var]!r} is not valid: {exc}") from None
    return rc


rc = _from_environment()
