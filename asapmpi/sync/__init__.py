"""asapmpi.sync: synchronization policies, selected by name."""
from __future__ import annotations

from ..errors import ConfigError
from .allreduce import Allreduce
from .backup_ps import BackupPS
from .base import Await, Policy, Reads, StepContext
from .baselines import BSP, Async
from .elastic import ElasticBSP
from .gossip import Gossip
from .hop import Hop
from .notify_ack import NotifyAck
from .spec import merge_spec

#: the policies offered by name (Exchange(sync=...), the command line); test-only ones,
#: such as asapmpi.testing's deliberately broken NOTIFY-ACK, are passed as classes
POLICIES = {p.name: p for p in (NotifyAck, BSP, Async, Hop, Allreduce, BackupPS,
                                ElasticBSP, Gossip)}


def policy(name, **options) -> Policy:
    """Return a new policy object for `name` with its options: a name in POLICIES,
    written alone or with options as on the command line ("hop:backup=1", merged with
    the keyword options), or a Policy subclass (a policy kept out of the registry).  A
    Policy object is returned as it is (it was made with its options)."""
    if isinstance(name, Policy):
        if options:
            raise ConfigError(f"sync={type(name).__name__}(...) is a policy object: pass "
                              f"its options {sorted(options)} when making it")
        return name
    if isinstance(name, type) and issubclass(name, Policy):
        cls = name
        name = cls.name
    else:
        if isinstance(name, str) and ":" in name:
            spec = name
            name, options = merge_spec(spec, options, _typed)
            if "transport" in options:
                raise ConfigError(f"sync={spec!r}: transport is the Exchange's option, not "
                                  f"the policy's; pass Exchange(..., transport="
                                  f"{options['transport']!r})")
        cls = _registered(name)
    try:
        return cls(**options)
    except TypeError:
        raise ConfigError(f"sync policy {name!r} has no option(s) named "
                          f"{sorted(options)}") from None


def _registered(name) -> type:
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown sync policy {name!r}; choose one of "
                          f"{sorted(POLICIES)}") from None


def _typed(name: str, options: dict) -> dict:
    # the options given of policy `name` in its declared types (transport, the
    # Exchange's, as given), so that a spec and keywords are compared by value
    given = {k: v for k, v in options.items() if k != "transport"}
    typed = _registered(name).OPTIONS.parse(name, given, defaults=False)
    return {**options, **typed}


__all__ = [
    "BSP", "POLICIES", "Allreduce", "Async", "Await", "BackupPS", "ElasticBSP", "Gossip", "Hop",
    "NotifyAck", "Policy", "Reads", "StepContext", "policy",
]
