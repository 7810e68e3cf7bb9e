"""A policy written as one string, the way the command line takes it:
"hop:backup=1:max_gap=3" is the policy "hop" with options backup=1 and max_gap=3.
Exchange(sync=...), asapmpi train --compare and asapmpi bench read the same spelling;
each policy's declared options (asapmpi.options) then convert the text to their types.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from ..errors import ConfigError
from ..options import NONE_WORDS


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
