"""What each MPI's launcher needs: one place for MPICH's hydra and Open MPI's mpiexec.

asapmpi-run, the CLI's own launches (`asapmpi train -n 8`, the benchmarks' jobs,
`asapmpi doctor`'s smoke test) and the test suite build their mpiexec command lines
here, so that a job limit, a forced network path or "let the survivors of a dead rank
run on" means the same on both families:

=====================  ==========================  ==========================================
                       MPICH (hydra)               Open MPI (4.x orterun, 5.x prterun)
=====================  ==========================  ==========================================
job time limit         MPIEXEC_TIMEOUT=S           --timeout S
more ranks than cores  (by itself)                 --oversubscribe --bind-to none,
                                                   mpi_yield_when_idle=1
hosts file             -f FILE                     --hostfile FILE
survivors run on       -disable-auto-cleanup       orte_abort_on_non_zero_status=0 (4.x)
network path "tcp"     NETWORK_PATH_ENV:           OPENMPI_TCP_ENV: ob1 over btl tcp,self,
                       ch4:ofi, FI_PROVIDER=tcp,   RMA by osc pt2pt (4.x) or osc rdma over
                       RMA as active messages      the tcp btl (5.x), loopback only
network path "ucx"     (none)                      OPENMPI_UCX_ENV: pml and osc ucx with
                                                   UCX_TLS=tcp,self on loopback
survive in place       (refused: MPICH's ULFM      --with-ft ulfm (5.x: prterun; the ft-mpi
(fault_tolerance)      fails here; restarts)       parameter set: ob1, mpi_ft_enable)
=====================  ==========================  ==========================================
"""
from __future__ import annotations

import functools
import math
import os
import re
import subprocess
from typing import Dict, List, Mapping, Optional, Tuple

from .errors import ConfigError

FLAVOURS = ("mpich", "openmpi")

#: MPICH settings that force RMA through the network module, TCP on loopback only.
#: RMA runs as MPICH active messages: libfabric's tcp provider emulates RMA with manual
#: progress, and a flush then waits for the target's CPU to poll libfabric: 20.8 ms per
#: notify_ack step of 64 KB on 8 oversubscribed ranks against 1.3 ms this way
#: (docs/BENCHMARKS.md).  NATIVE_TCP_RMA_ENV keeps libfabric's RMA, for tests.
NETWORK_PATH_ENV = {
    "MPIR_CVAR_NOLOCAL": "1",
    "MPIR_CVAR_CH4_NETMOD": "ofi",
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": "lo",
    "MPIR_CVAR_CH4_OFI_ENABLE_RMA": "0",
}
NATIVE_TCP_RMA_ENV = dict(NETWORK_PATH_ENV, MPIR_CVAR_CH4_OFI_ENABLE_RMA="1")

#: Open MPI: every byte over TCP on loopback.  Point to point by ob1 over the tcp and
#: self btls; with sm and ucx excluded, RMA is osc pt2pt (4.x; osc rdma refuses btls
#: without RDMA there) or osc rdma over the tcp btl's emulated RMA (5.x).  osc pt2pt
#: refuses MPI_THREAD_MULTIPLE, which mpi4py asks for by default; asapmpi needs no more
#: than serialized.
OPENMPI_TCP_ENV = {
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_btl": "tcp,self",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_osc": "^ucx,sm",
    "MPI4PY_RC_THREAD_LEVEL": "serialized",
}

#: Open MPI: point to point and RMA by UCX, whose only transport is TCP on loopback (a
#: cluster's InfiniBand stack with the hardware RMA taken away: UCX emulates puts and
#: atomics with active messages that the target must progress).
OPENMPI_UCX_ENV = {
    "OMPI_MCA_pml": "ucx",
    "OMPI_MCA_osc": "ucx",
    "OMPI_MCA_btl": "self",
    "OMPI_MCA_opal_common_ucx_tls": "any",
    "OMPI_MCA_opal_common_ucx_devices": "any",
    "UCX_TLS": "tcp,self",
    "UCX_NET_DEVICES": "lo",
}

#: the forced network paths each flavour has
NETWORKS = {"mpich": {"tcp": NETWORK_PATH_ENV},
            "openmpi": {"tcp": OPENMPI_TCP_ENV, "ucx": OPENMPI_UCX_ENV}}


@functools.lru_cache(maxsize=None)
def flavour(mpiexec: str) -> str:
    """"mpich" (hydra) or "openmpi", from `mpiexec --version`."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {mpiexec} --version: {exc}") from None
    text = out.stdout + out.stderr
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    if "Open MPI" in text or "OpenRTE" in text or "prte" in text.lower():
        return "openmpi"
    raise ConfigError(f"{mpiexec} is neither MPICH's hydra nor Open MPI's mpiexec; set "
                      f"MPIEXEC to one of them")


def ulfm_refusal(mpiexec: str) -> str:
    """"" when `mpiexec` can launch ranks that survive a dead one in place (Open MPI 5's
    `--with-ft ulfm`), else why not, in one sentence with what to use instead.  The
    ranks check their MPI library again (asapmpi.exchange.survive.refusal)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        text = str(exc)
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "unknown"
    if "HYDRA" in text:
        first = "MPICH's hydra"
    found = re.search(r"Open MPI\)?\s+v?(\d+)\.", text)
    if found and int(found.group(1)) >= 5:
        return ""
    return (f"surviving a dead rank in place needs an MPI with ULFM (Open MPI 5, launched "
            f"with mpiexec --with-ft ulfm: bash dev/setup-openmpi5.sh makes one); "
            f"{mpiexec} is {first}; use restarts (--restarts K, docs/FAILURES.md) instead")


def network_env(kind: str, network: str = "tcp") -> Dict[str, str]:
    """The environment that forces `network` ("tcp" or "ucx") on the `kind` MPI;
    ConfigError naming the ones it has."""
    try:
        return dict(NETWORKS[kind][network])
    except KeyError:
        have = ", ".join(NETWORKS.get(kind, {}))
        raise ConfigError(f"{kind} has no forced network path {network!r}; it has: "
                          f"{have}") from None


def _forbids(value: str, components: Tuple[str, ...]) -> bool:
    """True when an MCA selection (`a,b` or `^a,b`) leaves none of `components`."""
    value = value.strip().replace(" ", "")
    if not value:
        return False
    if value.startswith("^"):
        return set(components) <= set(value[1:].split(","))
    return not set(components) & set(value.split(","))


def network_forced(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when the MPI is told to send even local traffic through its network:
    MPICH's MPIR_CVAR_NOLOCAL, or Open MPI without its shared-memory btl (ob1) or with
    UCX on network transports only."""
    env = os.environ if env is None else env
    if env.get("MPIR_CVAR_NOLOCAL", "0").strip() not in ("", "0"):
        return True
    if env.get("OMPI_MCA_pml", "").strip() == "ucx":
        tls = env.get("UCX_TLS", "").strip().replace("^", "")
        local = ("sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "all")
        return bool(tls) and not env.get("UCX_TLS", "").startswith("^") \
            and not set(local) & set(tls.split(","))
    return _forbids(env.get("OMPI_MCA_btl", ""), ("vader", "sm"))


def command(kind: str, mpiexec: str, ranks: int, program: List[str],
            hosts: Optional[str] = None, job_timeout: float = 0,
            network: Optional[str] = None,
            keep_going: bool = False,
            fault_tolerance: bool = False) -> Tuple[List[str], Dict[str, str]]:
    """The mpiexec command line and the environment additions that run `program` on
    `ranks` ranks (see the table above).  `fault_tolerance`: launch so that the ranks
    can survive a dead one in place (ULFM: Open MPI 5's `--with-ft ulfm`); ConfigError
    on an MPI whose launcher cannot."""
    if kind not in FLAVOURS:
        raise ConfigError(f"unknown MPI flavour {kind!r}; one of {', '.join(FLAVOURS)}")
    if fault_tolerance and kind != "openmpi":
        raise ConfigError(f"surviving a dead rank in place needs Open MPI 5 (mpiexec "
                          f"--with-ft ulfm); {kind} has no launcher for it here: use "
                          f"restarts (--restarts K) instead")
    env = {"ASAPMPI_EXPECTED_SIZE": str(ranks)}
    cmd = [mpiexec, "-n", str(ranks)]
    limit = str(max(1, math.ceil(job_timeout))) if job_timeout else ""
    if kind == "mpich":
        if hosts:
            cmd += ["-f", hosts]
        if keep_going:
            cmd.append("-disable-auto-cleanup")
        if limit:
            env["MPIEXEC_TIMEOUT"] = limit
    else:
        if fault_tolerance:
            # prterun keeps the job when a rank dies, and loads the ft-mpi parameter set
            # (ob1, mpi_ft_enable=true) into every rank; osc ucx, which cannot run over
            # ob1, would only print its refusal on every rank
            cmd += ["--with-ft", "ulfm"]
            env["OMPI_MCA_osc"] = "^ucx"
        if hosts:
            cmd += ["--hostfile", hosts]
        else:
            # one host, maybe more ranks than cores: waiting ranks must yield the cores
            cmd += ["--oversubscribe", "--bind-to", "none",
                    "--mca", "mpi_yield_when_idle", "1"]
        if keep_going:
            # orterun (4.x) ends the job when a rank exits non-zero or is killed; with
            # --enable-recovery instead it would exit 0 after its ranks' MPI_Abort
            env["OMPI_MCA_orte_abort_on_non_zero_status"] = "0"
        if limit:
            cmd += ["--timeout", limit]
    if network:
        env.update(network_env(kind, network))
    return cmd + list(program), env
