"""Where a benchmark's jobs run: emulated hosts with shaped links (launch/netns-hosts),
or this one host.

    with EmulatedHosts(4, bandwidth="1gbit") as hosts:     # root and `ip netns`
        hosts.shape(narrow={3: "100mbit"})                 # one host's link narrower
        print(hosts.measure(0, 3))                         # a TCP ping-pong over it
        code = hosts.run(8, ["python", "-m", "asapmpi", "train", ...], timeout=900)

Both kinds run a program on `ranks` ranks with `run()`; only EmulatedHosts has links to
shape and measure, and ranks on several hosts: with hydra or Open MPI's mpiexec on a
hosts file, rank r lands on host r % hosts (netns-hosts places them round-robin, one per
host in turn), so `ranks_of(h)` names the ranks of host h.

EmulatedHosts(..., cores=0.45) also gives every host a CPU budget (netns-hosts cpu: a
cgroup with a CFS quota): its ranks together compute with that many cores, whatever the
other hosts do, so a slow host is one with less CPU (`budget({3: 0.25})`: host 3 gets a
quarter), not one that spins and takes cores from the rest.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import AsapError, ConfigError


def _span(hosts: List[int]) -> str:
    """0, 1, 2 -> '0-2'; 3 -> '3'; 0, 2 -> '0, 2'."""
    if len(hosts) > 2 and hosts == list(range(hosts[0], hosts[-1] + 1)):
        return f"{hosts[0]}-{hosts[-1]}"
    return ", ".join(map(str, hosts))

#: the script that makes the hosts: a source checkout's launch/ folder
NETNS_HOSTS = Path(__file__).resolve().parents[2] / "launch" / "netns-hosts"
#: a tc rate: digits, optional fraction, a unit tc knows
RATE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$")


def check_rate(flag: str, text: str) -> str:
    """`text` if it is a tc rate (1gbit, 200mbit), else a ConfigError naming `flag`."""
    if not RATE.match(text.lower()):
        raise ConfigError(f"{flag} {text}: give a rate like 1gbit or 200mbit")
    return text.lower()


def emulation_unavailable() -> Optional[str]:
    """Why emulated hosts cannot be made here (not root, no `ip netns`, no checkout),
    or None."""
    if not NETNS_HOSTS.is_file():
        return f"{NETNS_HOSTS} is missing (emulated hosts need a source checkout)"
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"emulated hosts need '{tool}'"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           check=False, timeout=30)
    if probe.returncode != 0:
        return f"'ip netns' does not work here: {probe.stderr.strip()}"
    return None


def sweep_orphans() -> List[str]:
    """Remove the emulated hosts whose owner was killed (netns-hosts sweep); one line
    per set removed.  Nothing where emulated hosts cannot be made."""
    if emulation_unavailable():
        return []
    proc = subprocess.run([str(NETNS_HOSTS), "sweep"], capture_output=True, text=True,
                          check=False, timeout=300)
    return [line.removeprefix("netns-hosts: ") for line in proc.stderr.splitlines()
            if line.strip()]


def default_cores(hosts: int) -> float:
    """Each host's CPU budget by default: nine tenths of this machine's cores shared
    evenly (the tenth left for mpiexec, the launcher and the system), to 0.01 core."""
    return math.floor(90 * (os.cpu_count() or 1) / hosts) / 100


def cgroup_cpu_unavailable() -> Optional[str]:
    """Why CPU budgets (a cgroup cpu controller) cannot be set here, or None."""
    if os.path.isfile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        return None
    try:
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "cpu" in f.read().split():
                return None
    except OSError:
        pass
    return "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with cpu)"


def add_host_arguments(parser, bandwidth: str) -> None:
    """-n, --hosts, --bandwidth (default `bandwidth`), --one-host and --host-cores: the
    options of the benchmarks that run on emulated hosts."""
    parser.add_argument("-n", "--ranks", type=int, default=8, help="ranks (default 8)")
    parser.add_argument("--hosts", type=int, default=4,
                        help="emulated hosts the ranks are spread over (default 4)")
    parser.add_argument("--bandwidth", default=bandwidth,
                        help=f"each host's link (tc rate, default {bandwidth})")
    parser.add_argument("--one-host", action="store_true",
                        help="no emulated hosts: every rank on this host")
    parser.add_argument("--host-cores", type=float,
                        help="each emulated host's CPU budget in cores (default: 0.9 of "
                             "this machine's cores shared by the hosts)")


def choose_hosts(args, say, budgets: bool = True, period_us: int = 10000):
    """(EmulatedHosts, or OneHost with --one-host or where they cannot be made, and the
    cores of each host's CPU budget or None): what add_host_arguments' options ask for;
    `say` gets one line for each thing that cannot be had here."""
    why_not = None if args.one_host else emulation_unavailable()
    if why_not:
        say(f"no emulated hosts ({why_not}): every rank on this host")
    cores = None
    if budgets and not (args.one_host or why_not):
        no_cgroup = cgroup_cpu_unavailable()
        if no_cgroup:
            say(f"no CPU budgets ({no_cgroup}): slow ranks spin, hosts share the cores")
        else:
            cores = args.host_cores or default_cores(args.hosts)
    if args.one_host or why_not:
        return OneHost(), cores
    return EmulatedHosts(args.hosts, args.bandwidth, cores=cores, period_us=period_us), cores


class OneHost:
    """Every rank on this host: shared memory between all of them, no links."""

    hosts = 1
    emulated = False
    budgeted = False

    def __enter__(self) -> "OneHost":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def describe(self) -> str:
        """One line for the report."""
        return "one host (no emulated links: every rank shares memory)"

    def command(self, ranks: int, program: Sequence[str], timeout: float,
                env: Optional[Dict[str, str]] = None, fault_tolerance: bool = False
                ) -> Tuple[List[str], Dict[str, str]]:
        """The command line and whole environment that run `program` on `ranks` ranks;
        `fault_tolerance`: launched so that the ranks survive a dead one in place
        (ConfigError where this MPI cannot)."""
        from ..launch.ranks import launch_command

        cmd, job_env = launch_command(ranks, list(program), None, timeout, fault_tolerance)
        return cmd, {**job_env, **(env or {})}

    def run(self, ranks: int, program: Sequence[str], timeout: float,
            env: Optional[Dict[str, str]] = None) -> int:
        """Run `program` on `ranks` ranks; its exit code."""
        from ..launch.ranks import call_job

        return call_job(*self.command(ranks, program, timeout, env))


class EmulatedHosts:
    """`count` hosts in network namespaces (launch/netns-hosts) whose links to the switch
    are shaped to `bandwidth`; removed on exit."""

    emulated = True

    def __init__(self, count: int, bandwidth: Optional[str] = None,
                 prefix: Optional[str] = None, cores: Optional[float] = None,
                 period_us: int = 10000):
        if count < 2:
            raise ConfigError(f"--hosts must be at least 2 for emulated hosts, got {count}")
        # (netns-hosts cpu refuses budgets that add up to more than the machine's cores)
        if cores is not None and not cores >= 0.001:
            raise ConfigError(f"--host-cores {cores:g}: give at least 0.001")
        self.hosts = count
        self.bandwidth = bandwidth
        self.prefix = prefix or f"bt{uuid.uuid4().hex[:6]}"
        self.narrow: Dict[int, str] = {}
        self.cores = cores
        self.period_us = period_us
        #: each host's CPU budget in cores (None: no limit), as netns-hosts set it
        self.budgets: List[Optional[float]] = [None] * count
        self.budget_text = ""

    @property
    def budgeted(self) -> bool:
        """Whether the hosts have CPU budgets (cores was given)."""
        return self.cores is not None

    def _script(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run([str(NETNS_HOSTS), *args], capture_output=True, text=True,
                              check=False, timeout=timeout)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise AsapError(f"netns-hosts {' '.join(args[:1])} failed: "
                            f"{lines[-1] if lines else f'exit code {proc.returncode}'}")
        return proc.stdout

    def _shaping(self) -> List[str]:
        args = ["--bandwidth", self.bandwidth] if self.bandwidth else []
        for host, rate in sorted(self.narrow.items()):
            args += ["--host", f"{host}:bandwidth={rate}"]
        return args

    def __enter__(self) -> "EmulatedHosts":
        # the CPU budgets come with budget(), which each scenario calls with its own;
        # this process (the script's parent) owns the set: killed, it leaves the set to
        # the next `up` or `asapmpi doctor --clean` (netns-hosts sweep), which remove it
        self._script("up", str(self.hosts), self.prefix, *self._shaping())
        return self

    def budget(self, fractions: Dict[int, float]) -> None:
        """Every host `cores` cores of CPU, but host h `fractions[h]` of that."""
        spec = [f"all={self.cores:g}"] + [f"{h}={self.cores * f:g}"
                                          for h, f in sorted(fractions.items())]
        out = self._script("cpu", self.prefix, "--period", str(self.period_us), *spec)
        budgets, notes = [], []
        for line in out.splitlines():
            if line.startswith("cpu: "):
                _, fields = line[5:].split(" ", 1)
                kv = dict(f.split("=", 1) for f in fields.split())
                budgets.append(None if kv["cores"] == "none" else float(kv["cores"]))
                period = kv["period"]
            else:
                notes.append(line.removeprefix("netns-hosts: "))
        self.budgets = budgets
        groups: Dict[Optional[float], List[int]] = {}
        for h, c in enumerate(budgets):
            groups.setdefault(c, []).append(h)
        parts = [f"host{'s' if len(hs) > 1 else ''} {_span(hs)} "
                 f"{'unlimited' if c is None else f'{c:g} cores'}"
                 for c, hs in groups.items()]
        self.budget_text = (f"CPU budgets: {', '.join(parts)} (cgroup quota per "
                            f"{int(period.removesuffix('us')) / 1000:g} ms, while the "
                            f"training clock runs)"
                            + "".join(f"; {n}" for n in notes))

    def __exit__(self, *exc) -> None:
        subprocess.run([str(NETNS_HOSTS), "down", self.prefix], capture_output=True,
                       check=False, timeout=120)

    def shape(self, narrow: Optional[Dict[int, str]] = None) -> None:
        """Every link at the configured bandwidth, but the hosts of `narrow`
        ({host: rate}) at theirs."""
        narrow = dict(narrow or {})
        if narrow == self.narrow:
            return
        self.narrow = narrow
        self._script("shape", self.prefix, *(self._shaping() or ["--clear"]))

    def measure(self, a: int, b: int) -> str:
        """netns-hosts' measured link between hosts a and b (configured next to it)."""
        return self._script("measure", self.prefix, str(a), str(b)).strip()

    def describe(self) -> str:
        """One line for the report."""
        links = f"links {self.bandwidth}" if self.bandwidth else "unshaped links"
        narrow = "".join(f", host {h} at {r}" for h, r in sorted(self.narrow.items()))
        cpu = f"; {self.budget_text}" if self.budget_text else ""
        return f"{self.hosts} emulated hosts ({links}{narrow}{cpu})"

    def ranks_of(self, host: int, ranks: int) -> List[int]:
        """The ranks netns-hosts puts on `host` (round-robin over the hosts)."""
        return [r for r in range(ranks) if r % self.hosts == host]

    def command(self, ranks: int, program: Sequence[str], timeout: float,
                env: Optional[Dict[str, str]] = None, fault_tolerance: bool = False
                ) -> Tuple[List[str], Dict[str, str]]:
        """The command line and whole environment that run `program` on `ranks` ranks
        spread over the hosts; `fault_tolerance`: launched so that the ranks survive a
        dead one in place (Open MPI 5's `--with-ft ulfm`; ConfigError where this MPI
        cannot)."""
        from ..launch.ranks import find_mpiexec
        from ..launchers import ulfm_refusal

        job_env = dict(os.environ, **(env or {}))
        # the launcher of the MPI mpi4py uses, not the first mpiexec on PATH
        job_env.setdefault("MPIEXEC", find_mpiexec())
        if timeout:
            job_env["MPIEXEC_TIMEOUT"] = str(int(timeout))
        # MPICH between hosts: RMA as active messages over libfabric's tcp provider, as
        # on the forced network path (asapmpi.launchers.NETWORK_PATH_ENV explains why)
        job_env.setdefault("MPIR_CVAR_CH4_OFI_ENABLE_RMA", "0")
        job_env["ASAPMPI_EXPECTED_SIZE"] = str(ranks)
        if self.budgeted:
            # the ranks start unlimited and hold themselves to their host's budget while
            # their training clock runs (asapmpi.launch.budget): a starved host does not
            # spend minutes importing torch, evaluating and shutting down
            job_env["NETNS_HOSTS_BUDGET"] = "deferred"
        ft: List[str] = []
        if fault_tolerance:
            why = ulfm_refusal(job_env["MPIEXEC"])
            if why:
                raise ConfigError(why)
            ft = ["--with-ft", "ulfm"]
            # as asapmpi.launchers.command: osc ucx cannot run over ob1 (ULFM's pml)
            # and would print its refusal on every rank
            job_env.setdefault("OMPI_MCA_osc", "^ucx")
        return [str(NETNS_HOSTS), "mpiexec", self.prefix, *ft, "-n", str(ranks),
                *program], job_env

    def run(self, ranks: int, program: Sequence[str], timeout: float,
            env: Optional[Dict[str, str]] = None) -> int:
        """Run `program` on `ranks` ranks spread over the hosts; its exit code."""
        from ..launch.ranks import call_job

        # (the script execs mpiexec: it dies with this process, and the ranks with it)
        return call_job(*self.command(ranks, program, timeout, env))
