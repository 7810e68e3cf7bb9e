"""Options declared once and parsed by their type: the one parser of every option a user
gives asapmpi.

An owner (a policy, the trainer for its options of a run, the Exchange for its switches,
asapmpi.rc) declares each of its options once, as an `Option`: name, type, default, range
or choices, one line of help.  One parser (`Options.parse`, `Option.convert`) turns what
a user gave into them, whether written as text on the command line ("hop:max_gap=3",
`--hop suppress_late=no`, an environment variable) or passed as a keyword
(Exchange(sync="hop", max_gap=3)): booleans from a fixed set of words, integers and
floats checked for type and range, choices by name.  Anything else is refused with one
ConfigError line naming the option, its owner, what is allowed and what was given,
before any communication.  (Here, not in asapmpi.sync: asapmpi.rc parses with it, and
the policies' package imports rc.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from .errors import ConfigError

#: the spellings of a boolean option's value, in any case (anything else is refused)
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
#: the spellings of "no value" for an option that may be left unset (None)
NONE_WORDS = ("none", "null")


@dataclass(frozen=True)
class Option:
    """One option: its name, type (bool, int, float, str or list: a list of integers,
    written 1/3 as text), default, range (low and high, inclusive unless
    open_low/open_high), choices (for str), whether it may be None (unset), and one line
    of help."""

    name: str
    kind: type
    default: Any
    help: str = ""
    low: Optional[float] = None
    high: Optional[float] = None
    open_low: bool = False
    open_high: bool = False
    choices: Tuple[str, ...] = ()
    optional: bool = False

    def allowed(self) -> str:
        """What the option takes, in words: "an integer >= 1", "a finite number in (0, 1)"."""
        if self.kind is bool:
            what = (f"true or false ({'/'.join(TRUE_WORDS)} or "
                    f"{'/'.join(FALSE_WORDS)})")
        elif self.kind is str:
            what = "one of " + ", ".join(repr(c) for c in self.choices)
        else:
            noun = {int: "an integer", float: "a finite number",
                    list: "a list of integers (as text 1/3), each"}[self.kind]
            what = noun + self._range()
        return what + (" or none" if self.optional else "")

    def _range(self) -> str:
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            return (f" in {'(' if self.open_low else '['}{_num(lo)}, "
                    f"{_num(hi)}{')' if self.open_high else ']'}")
        if lo is not None:
            return f" {'>' if self.open_low else '>='} {_num(lo)}"
        if hi is not None:
            return f" {'<' if self.open_high else '<='} {_num(hi)}"
        return ""

    def convert(self, owner: str, value: Any, where: str = "") -> Any:
        """`value` (text or a Python value) as this option's type, checked; ConfigError
        in one line naming the option and `owner` (and `where` it was written, when
        given) for anything it does not take."""
        if self.optional and (value is None or (isinstance(value, str)
                                                and value.strip().lower() in NONE_WORDS)):
            return None
        got = _CONVERT[self.kind](self, value)
        if got is _BAD or not self._in_range(got):
            raise ConfigError(f"{owner} option {self.name} must be {self.allowed()}, got "
                              f"{value!r}{' ' + where if where else ''}")
        return got

    def _in_range(self, value: Any) -> bool:
        if self.kind is list:
            return all(self._in_range_one(v) for v in value)
        return self.kind not in (int, float) or self._in_range_one(value)

    def _in_range_one(self, v) -> bool:
        if self.low is not None and (v <= self.low if self.open_low else v < self.low):
            return False
        return not (self.high is not None
                    and (v >= self.high if self.open_high else v > self.high))


_BAD = object()


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _to_bool(opt: Option, value: Any):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    return _BAD


def _to_int(opt: Option, value: Any):
    if isinstance(value, (bool, np.bool_)):
        return _BAD
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return _BAD
    return _BAD


def _to_float(opt: Option, value: Any):
    if isinstance(value, (bool, np.bool_)):
        return _BAD
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return _BAD
    if not isinstance(value, (int, float, np.integer, np.floating)):
        return _BAD
    value = float(value)
    return value if math.isfinite(value) else _BAD


def _to_str(opt: Option, value: Any):
    return value if isinstance(value, str) and value in opt.choices else _BAD


def _to_ints(opt: Option, value: Any):
    if isinstance(value, str):
        value = [p for p in value.strip().split("/") if p] if value.strip() else []
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return _BAD
    out = [_to_int(opt, v) for v in value]
    return _BAD if any(v is _BAD for v in out) else out


_CONVERT: Dict[type, Callable[[Option, Any], Any]] = {
    bool: _to_bool, int: _to_int, float: _to_float, str: _to_str, list: _to_ints}


class Options:
    """The options of one owner (a policy, the trainer), each declared once."""

    def __init__(self, *options: Option):
        self.by_name: Dict[str, Option] = {o.name: o for o in options}

    def __iter__(self):
        return iter(self.by_name.values())

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def parse(self, owner: str, given: Mapping[str, Any], defaults: bool = True,
              where: str = "") -> Dict[str, Any]:
        """`given` (text or values, by option name) as the declared types, checked, with
        the defaults of those not given (unless defaults=False); an unknown name is
        refused in one line that lists the known ones.  `where` says where they were
        written ("in 'hop:backup=x'"), for the error."""
        unknown = sorted(set(given) - set(self.by_name))
        if unknown:
            known = (f"its options: {', '.join(self.by_name)}" if self.by_name
                     else "it takes none")
            raise ConfigError(f"{owner} has no option(s) named {unknown}"
                              f"{' ' + where if where else ''}; {known}")
        # the defaults go through the same conversion: a default and the same value
        # given compare equal across ranks
        out = {o.name: o.convert(owner, o.default) for o in self} if defaults else {}
        for name, value in given.items():
            out[name] = self.by_name[name].convert(owner, value, where)
        return out

    def describe(self) -> str:
        """One line per option: name, what it takes, default, help."""
        return "\n".join(f"{o.name}: {o.allowed()} (default {o.default!r}); {o.help}"
                         for o in self)
