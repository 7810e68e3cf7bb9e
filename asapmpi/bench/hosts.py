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
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..errors import AsapError, ConfigError

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


class OneHost:
    """Every rank on this host: shared memory between all of them, no links."""

    hosts = 1
    emulated = False

    def __enter__(self) -> "OneHost":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def describe(self) -> str:
        """One line for the report."""
        return "one host (no emulated links: every rank shares memory)"

    def run(self, ranks: int, program: Sequence[str], timeout: float,
            env: Optional[Dict[str, str]] = None) -> int:
        """Run `program` on `ranks` ranks; its exit code."""
        from ..ranks import launch_command

        cmd, job_env = launch_command(ranks, list(program), None, timeout)
        return subprocess.call(cmd, env={**job_env, **(env or {})})


class EmulatedHosts:
    """`count` hosts in network namespaces (launch/netns-hosts) whose links to the switch
    are shaped to `bandwidth`; removed on exit."""

    emulated = True

    def __init__(self, count: int, bandwidth: Optional[str] = None,
                 prefix: Optional[str] = None):
        if count < 2:
            raise ConfigError(f"--hosts must be at least 2 for emulated hosts, got {count}")
        self.hosts = count
        self.bandwidth = bandwidth
        self.prefix = prefix or f"bt{uuid.uuid4().hex[:6]}"
        self.narrow: Dict[int, str] = {}

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
        self._script("up", str(self.hosts), self.prefix, *self._shaping())
        return self

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
        return f"{self.hosts} emulated hosts ({links}{narrow})"

    def ranks_of(self, host: int, ranks: int) -> List[int]:
        """The ranks netns-hosts puts on `host` (round-robin over the hosts)."""
        return [r for r in range(ranks) if r % self.hosts == host]

    def run(self, ranks: int, program: Sequence[str], timeout: float,
            env: Optional[Dict[str, str]] = None) -> int:
        """Run `program` on `ranks` ranks spread over the hosts; its exit code."""
        from ..ranks import find_mpiexec

        job_env = dict(os.environ, **(env or {}))
        # the launcher of the MPI mpi4py uses, not the first mpiexec on PATH
        job_env.setdefault("MPIEXEC", find_mpiexec())
        if timeout:
            job_env["MPIEXEC_TIMEOUT"] = str(int(timeout))
        # MPICH between hosts: RMA as active messages over libfabric's tcp provider, as
        # on the forced network path (asapmpi.launchers.NETWORK_PATH_ENV explains why)
        job_env.setdefault("MPIR_CVAR_CH4_OFI_ENABLE_RMA", "0")
        job_env["ASAPMPI_EXPECTED_SIZE"] = str(ranks)
        return subprocess.call([str(NETNS_HOSTS), "mpiexec", self.prefix, "-n", str(ranks),
                                *program], env=job_env)
