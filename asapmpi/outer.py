"""The outer optimizer's settings (DiLoCo's local steps and outer Nesterov step),
declared once and checked before any communication: the torch optimizer wrapper
(asapmpi.torch.DecentralizedOptimizer) and the trainer's configuration
(asapmpi.train.config) both take them from here, and neither imports the other.

    settings, period = resolve(outer="diloco", local_steps=50, period=None,
                               outer_lr=0.7, outer_momentum=0.9, owner="...")

The step itself works on torch tensors and lives with the wrapper
(bindings/torch/outer.py); docs/LOWCOMM.md says what it does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from .errors import ConfigError
from .options import Option, Options

#: the outer optimizers offered by name
METHODS = ("diloco",)

#: the options of the outer optimizer, each declared once (keywords of the optimizer
#: wrapper, options of a run spec, flags of `asapmpi train`)
OPTIONS = Options(
    Option("outer", str, None, "the outer optimizer (diloco: Nesterov momentum on the "
                               "mixed pseudo-gradient)", choices=METHODS, optional=True),
    Option("local_steps", int, None, "inner optimizer steps per round (H): the exchange "
                                     "and the outer step come every H steps",
           low=1, optional=True),
    Option("outer_lr", float, 0.7, "the outer learning rate", low=0, open_low=True),
    Option("outer_momentum", float, 0.9, "the outer Nesterov momentum",
           low=0, high=1, open_high=True),
)
#: the option names (the keywords the wrapper takes, the fields of TrainConfig)
NAMES = tuple(o.name for o in OPTIONS)


@dataclass(frozen=True)
class OuterSettings:
    """What the outer optimizer does: `method` (one of METHODS), every `local_steps`
    inner steps, with learning rate `lr` and Nesterov momentum `momentum`."""

    method: str
    local_steps: int
    lr: float
    momentum: float

    def key(self) -> Tuple[Any, ...]:
        """The settings as a tuple (compared across ranks at creation)."""
        return (self.method, self.local_steps, self.lr, self.momentum)


def resolve(outer: Optional[str], local_steps: Optional[int], period: Optional[int],
            outer_lr: Optional[float], outer_momentum: Optional[float],
            owner: str) -> Tuple[Optional[OuterSettings], Optional[int]]:
    """(the outer optimizer's settings, or None without `outer`; the exchange period:
    local_steps with `outer`, else `period` as given).  local_steps aliases period when
    outer is given (one of them is required; both must then agree); without outer,
    local_steps, outer_lr and outer_momentum are refused rather than ignored.  ConfigError
    in one line naming `owner` for anything else out of range."""
    given = {"local_steps": local_steps, "outer_lr": outer_lr,
             "outer_momentum": outer_momentum}
    if outer is None:
        extra = [name for name, value in given.items() if value is not None]
        if extra:
            raise ConfigError(f"{owner}: {', '.join(extra)} go(es) with outer="
                              f"{METHODS[0]!r} (local steps and an outer optimizer); "
                              f"pass outer={METHODS[0]!r}, or period= alone to exchange "
                              f"every `period` steps")
        return None, period
    parsed = OPTIONS.parse(owner, {"outer": outer, **{k: v for k, v in given.items()
                                                     if v is not None}})
    if period is not None and (isinstance(period, bool) or not isinstance(period, int)
                               or period < 1):
        raise ConfigError(f"{owner}: period must be an integer >= 1, got {period!r}")
    steps = parsed["local_steps"]
    if steps is None and period is None:
        raise ConfigError(f"{owner}: outer={outer!r} needs local_steps=H, the inner "
                          f"steps of a round (DiLoCo uses tens to hundreds)")
    if steps is not None and period is not None and steps != period:
        raise ConfigError(f"{owner}: local_steps={steps} and period={period} disagree; "
                          f"with outer={outer!r} pass local_steps alone (it is the period)")
    steps = steps if steps is not None else period
    return OuterSettings(parsed["outer"], steps, parsed["outer_lr"],
                         parsed["outer_momentum"]), steps


def policy_refusal(policy_class: Any, sync: Any) -> Optional[str]:
    """Why the outer optimizer cannot run over `policy_class` (the class of policy
    `sync`), or None: policies that decide themselves when each worker synchronizes
    (elastic), or whose server rank only averages (backup_ps), have no rounds of H local
    steps on every rank."""
    if getattr(policy_class, "global_iterations", False) or \
            hasattr(policy_class, "role"):
        return (f"sync={sync!r} has a server rank that only averages and decides when "
                f"workers synchronize, so no rank runs rounds of local steps of its own; "
                f"the outer optimizer runs over allreduce (DiLoCo), gossip, notify_ack, "
                f"hop, bsp or async")
    return None
