"""asapmpi.sync: synchronization policies, selected by name."""
from __future__ import annotations

from ..errors import ConfigError
from .allreduce import Allreduce
from .base import Policy, StepContext
from .baselines import BSP, Async
from .notify_ack import NotifyAck, NotifyAckIgnoringAcks

POLICIES = {p.name: p for p in (NotifyAck, BSP, Async, Allreduce, NotifyAckIgnoringAcks)}


def policy(name: str) -> Policy:
    """Return a new policy object for `name`."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(f"unknown sync policy {name!r}; choose one of "
                          f"{sorted(POLICIES)}") from None


__all__ = [
    "BSP", "POLICIES", "Allreduce", "Async", "NotifyAck", "NotifyAckIgnoringAcks", "Policy",
    "StepContext", "policy",
]
