"""Runtime configuration: one object, documented defaults, environment overrides.

Every environment variable asapmpi reads is named here and read once, at import.
Unknown keys are refused so that a typo does not silently keep a default.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from .errors import ConfigError

#: environment variable -> rc field
ENVIRONMENT = {
    "ASAPMPI_TIMEOUT": "timeout",
    "ASAPMPI_POLL_YIELDS": "poll_yields",
    "ASAPMPI_POLL_MAX_SLEEP_US": "poll_max_sleep_us",
}


@dataclass
class RC:
    """Defaults for every Exchange; change them with ``asapmpi.rc.timeout = ...``.

    timeout: seconds a wait on a neighbour may last before NeighbourTimeoutError.
    poll_yields: unsuccessful polls answered with sched_yield before sleeping.
    poll_max_sleep_us: longest sleep between two polls, microseconds.
    """

    timeout: float = 60.0
    poll_yields: int = 32
    poll_max_sleep_us: int = 100

    def __setattr__(self, name, value):
        known = {f.name: f.type for f in fields(self)}
        if name not in known:
            raise ConfigError(f"asapmpi.rc has no option {name!r}; known: {sorted(known)}")
        value = float(value) if name == "timeout" else int(value)
        if (value <= 0 and name != "poll_yields") or value < 0:
            raise ConfigError(f"asapmpi.rc.{name} must be positive, got {value}")
        object.__setattr__(self, name, value)


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
