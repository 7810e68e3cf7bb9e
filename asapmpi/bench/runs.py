"""The policy runs that `asapmpi bench reduce` times, POLICY[:OPTION=VALUE...] such as
hop:backup=1 or bsp:transport=messages: what they may name, and each run split into its
policy and options.  Shared by the command (asapmpi.bench.reduce, which checks them
before any job starts) and the job that runs them (asapmpi.bench.reduce_job).
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Tuple

from ..errors import ConfigError
from ..sync import policy as make_policy
from ..sync.spec import parse_options
from ..transports import TRANSPORTS, resolve

#: policies whose step is an averaging step over any graph
STEP_POLICIES = ("notify_ack", "bsp", "async", "hop", "gossip")
#: policies that fix their own graph (a star around a server): timed on it, whatever
#: --graphs says.  elastic is timed per superstep (its server runs one per step(), a
#: worker up to R local steps and then its exchange with the server: reduce_job)
FIXED_GRAPH_POLICIES = ("backup_ps", "elastic")
#: policies that run on a graph of their own whatever --graphs says: the stars, and
#: gossip (any rank may pull from any other: the complete graph)
OWN_GRAPH_POLICIES = (*FIXED_GRAPH_POLICIES, "gossip")


def policy_specs(text: str) -> List[str]:
    """"notify_ack,hop:backup=1,bsp:transport=messages" -> the runs, each checked: a
    known policy, options it takes (asapmpi.sync.make_policy) and a transport that fits
    it (asapmpi.transports.resolve)."""
    runs = [t.strip() for t in text.split(",") if t.strip()]
    if not runs:
        raise argparse.ArgumentTypeError(f"no policy in {text!r}")
    for run in runs:
        name, *opts = run.split(":")
        if name not in STEP_POLICIES + FIXED_GRAPH_POLICIES:
            raise argparse.ArgumentTypeError(
                f"unknown policy {name!r}; choose from "
                f"{','.join(STEP_POLICIES + FIXED_GRAPH_POLICIES)}")
        try:
            options = parse_options(opts, f"in {run!r}")
            # transport= goes to the Exchange, every other option to the policy
            transport = options.pop("transport", "auto")
            if transport not in TRANSPORTS:
                raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}")
            policy = make_policy(name, **options)
            if transport != "auto":
                resolve(transport, policy)
        except (ConfigError, TypeError) as exc:
            raise argparse.ArgumentTypeError(f"{run}: {exc}") from None
    return list(dict.fromkeys(runs))


def split_spec(run: str) -> Tuple[str, Dict[str, Any]]:
    """"hop:backup=1" -> ("hop", {"backup": 1})."""
    name, *opts = run.split(":")
    return name, parse_options(opts, f"in {run!r}")


def policy_of(run: str):
    """The policy object of a run ("hop:backup=1"); transport= is the Exchange's."""
    sync, options = split_spec(run)
    options.pop("transport", None)
    return make_policy(sync, **options)
