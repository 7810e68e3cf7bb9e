"""Hosts files and host lists, checked before MPICH's hydra reads them.

hydra reads a host's slot count with atoi() and never checks it: `localhost:0` and
`host:abc` (atoi: 0) end mpiexec with SIGFPE and no message, `localhost:-2` leaves it
spinning at 100% CPU, deaf to SIGTERM and to its own MPIEXEC_TIMEOUT, and `:2` (no host)
hangs it (MPICH 5.0.2; issue 49).  asapmpi-run therefore checks every place hydra takes
hosts from: its own --hosts FILE, the host options passed through --mpi-args (-f,
-hostfile, -machinefile FILE; -hosts, -host, -hostlist, -machine, -machines,
-machinelist LIST) and HYDRA_HOST_FILE, which hydra reads when no host is given.  A
mistake is one line naming where it is (the file and line, or the option), the entry
and what to write instead.

hydra's syntax (src/pm/hydra/lib/utils/args.c, HYDU_parse_hostfile and
HYDU_process_mfile_token): one host a line, `HOST[:SLOTS]`, then optionally
`binding=VALUE` and `user=VALUE`; blank lines and lines whose first non-blank character
is `#` are skipped (a `#` after an entry is not a comment to hydra).  A list is the same
entries separated by commas.  Open MPI's hostfiles (`HOST slots=N`) are parsed by Open
MPI's own lexer, which reports its mistakes itself: they are not checked here.
"""
from __future__ import annotations

import os
import re
from typing import Iterable, List, Mapping, Optional, Sequence

from ..errors import ConfigError

#: hydra's options (after its leading dashes, any case) that name a hosts file, and
#: those that take a comma-separated list of HOST[:SLOTS]
FILE_OPTIONS = ("f", "hostfile", "machinefile")
LIST_OPTIONS = ("host", "hosts", "hostlist", "machine", "machines", "machinelist")
#: what hydra accepts after the host on a line of a hosts file
LINE_KEYS = ("binding", "user")

EXAMPLE = "write HOST or HOST:SLOTS with SLOTS a whole number >= 1, e.g. localhost:4"


def entry_problem(entry: str) -> Optional[str]:
    """What is wrong with one `HOST[:SLOTS]` entry as hydra reads it, or None."""
    host, colon, slots = entry.partition(":")
    if not host:
        return f"'{entry}' has no host name"
    if not colon:
        return None
    if ":" in slots:
        return f"'{entry}' has more than one ':'"
    if not slots:
        return f"'{entry}' has no slot count after ':'"
    if not re.fullmatch(r"[+-]?[0-9]+", slots):
        return f"'{entry}': the slot count '{slots}' is not a whole number"
    if int(slots) < 1:
        return f"'{entry}': {int(slots)} slots; a host needs at least 1"
    return None


def line_problem(line: str) -> Optional[str]:
    """What is wrong with one (not blank, not comment) line of a hydra hosts file."""
    entry, *rest = line.split()
    problem = entry_problem(entry)
    if problem:
        return f"{problem}; {EXAMPLE}"
    for token in rest:
        key, eq, value = token.partition("=")
        if key not in LINE_KEYS or not eq or not value:
            return (f"'{token}' after the host: hydra takes only "
                    f"{' or '.join(k + '=VALUE' for k in LINE_KEYS)} there (no spaces "
                    f"around ':'; comments on lines of their own)")
    return None


def check_hosts_file(path: str, source: str) -> int:
    """ConfigError naming `source` (how the file was given), the line and the mistake
    when `path` is not a hosts file hydra reads safely; returns the hosts it names."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it ({exc.strerror})") from None
    hosts = 0
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        problem = line_problem(line)
        if problem:
            raise ConfigError(f"{source}, line {number}: {problem}")
        hosts += 1
    if not hosts:
        raise ConfigError(f"{source} names no host (hydra would run every rank here); "
                          f"{EXAMPLE}, one a line")
    return hosts


def check_host_list(text: str, source: str) -> None:
    """ConfigError naming `source` and the entry when the comma-separated list `text`
    has a `HOST[:SLOTS]` entry hydra misreads."""
    for entry in text.split(","):
        problem = entry_problem(entry.strip())
        if problem:
            raise ConfigError(f"{source}: {problem}; {EXAMPLE}, separated by commas")


def _host_options(args: Sequence[str]) -> Iterable[tuple]:
    """(option as written, hydra's name for it, its value or None) of each host option
    in the mpiexec arguments `args` (hydra: any number of leading dashes, any case,
    the value after '=' or in the next argument)."""
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        name = name.lower()
        if name in FILE_OPTIONS or name in LIST_OPTIONS:
            given = value if eq else (args[i + 1] if i + 1 < len(args) else None)
            yield arg.partition("=")[0], name, given


def check_hosts(kind: str, hosts_file: Optional[str], mpi_args: List[str],
                env: Mapping[str, str]) -> None:
    """Check every hosts file and host list the `kind` launcher of this job will read
    (MPICH's hydra only: see the module docstring), before it starts."""
    if kind != "mpich":
        return
    given = False
    if hosts_file:
        check_hosts_file(hosts_file, f"--hosts {hosts_file}")
        given = True
    for option, name, value in _host_options(mpi_args):
        if value is None:
            raise ConfigError(f"--mpi-args: {option} needs a value")
        if name in FILE_OPTIONS:
            if not os.path.isfile(value):
                raise ConfigError(f"--mpi-args {option} {value}: no such file")
            check_hosts_file(value, f"--mpi-args {option} {value}")
        else:
            check_host_list(value, f"--mpi-args {option} {value}")
        given = True
    path = env.get("HYDRA_HOST_FILE")
    if path and not given:
        if not os.path.isfile(path):
            raise ConfigError(f"HYDRA_HOST_FILE={path}: no such file; unset it or name "
                              f"a hosts file")
        check_hosts_file(path, f"HYDRA_HOST_FILE={path}")
