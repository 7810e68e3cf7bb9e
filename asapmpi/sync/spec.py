"""Options, declared once and parsed by their type, and a policy written as one string.

A policy (and the trainer, for its options of a run) declares each of its options once,
as an `Option`: name, type, default, range or choices, one line of help.  One parser
(`Options.parse`) turns what a user gave into them, whether written as text on the
command line ("hop:max_gap=3", `--hop suppress_late=no`) or passed as a keyword
(Exchange(sync="hop", max_gap=3)): booleans from a fixed set of words, integers and
floats checked for type and range, choices by name.  Anything else is refused with one
ConfigError line naming the option, its owner, what is allowed and what was given,
before any communication.

"hop:backup=1:max_gap=3" is the policy "hop" with options backup=1 and max_gap=3;
Exchange(sync=...), asapmpi train --compare and asapmpi bench read the same spelling.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from ..errors import ConfigError

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


def parse_value(text: str) -> Any:
    """An option value from text, for options no declaration reads (a declared option
    converts the text itself, Option.convert): None, a bool (true/false, any case), an
    int, a float, a list of numbers written with '/' ("4/5/6/7": commas separate the runs
    of --compare), else text."""
    if "/" in text:
        parts = [parse_value(p) for p in text.split("/")]
        if all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts):
            return parts
    low = text.lower()
    if low in NONE_WORDS:
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_options(pairs: Iterable[str], where: str) -> Dict[str, Any]:
    """["backup=1", "max-gap=3"] -> {"backup": 1, "max_gap": 3}; `where` names the
    source in the error ("in 'hop:backup'", "--hop")."""
    options = {}
    for pair in pairs:
        key, eq, val = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"option {pair!r} {where} is not OPTION=VALUE "
                              f"(e.g. backup=1)")
        options[key.replace("-", "_")] = parse_value(val)
    return options


def split_spec(spec: str) -> Tuple[str, Dict[str, Any]]:
    """"hop:backup=1:max_gap=3" -> ("hop", {"backup": 1, "max_gap": 3})."""
    name, *opts = spec.strip().split(":")
    return name, parse_options(opts, f"in {spec!r}")


def merge_spec(spec: str, options: Dict[str, Any],
               convert: Optional[Callable[[str, Dict[str, Any]], Dict[str, Any]]] = None
               ) -> Tuple[str, Dict[str, Any]]:
    """The policy name and options of `spec` ("hop:backup=1") together with options
    given as keywords; one given both ways with two values is refused in one line.
    `convert(name, options)`, when given, turns both into the policy's types before they
    are compared (suppress_late=no and suppress_late=False agree)."""
    name, written = split_spec(spec)
    if convert is not None:
        written, options = convert(name, written), convert(name, options)
    for key in sorted(set(written) & set(options)):
        if written[key] != options[key]:
            raise ConfigError(f"sync={spec!r} sets {key}={written[key]!r} but the keyword "
                              f"{key}={options[key]!r} differs; give it once")
    return name, {**written, **options}
