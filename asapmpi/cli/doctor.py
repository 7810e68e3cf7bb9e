"""`asapmpi doctor`: is this installation able to run asapmpi, and how?

Reports which MPI library mpi4py loaded, which one the extension was built against and
whether their ABIs match, whether one-sided traffic between ranks of a host takes the
shared-memory or the network path, whether MPI's asynchronous progress is on, whether
it can survive a dead rank in place (ULFM: Open MPI 5), and then
runs a 2-rank smoke test (put, notify, verified reduce, with checksums) under mpiexec,
reporting the window memory model and the transport that transport="auto" measured
and chose.  The exit code is 0 when every check passes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List, Tuple

from ..launch.ranks import active_message_rma
from ..launchers import network_forced
from ..outputs import output_file

SMOKE_TAG = "ASAPMPI-DOCTOR"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi doctor`."""
    parser.add_argument("--network", nargs="?", const="tcp", choices=("tcp", "ucx"),
                        help="run the smoke test on the MPI's forced network path: tcp "
                             "(MPICH's ch4:ofi, Open MPI's tcp btl) or ucx (Open MPI)")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write the report as JSON")
    parser.add_argument("--clean", action="store_true",
                        help="remove the stale shared-memory files of this user's ended "
                             "jobs (asapmpi's and the MPI library's) from /dev/shm, and "
                             "the emulated hosts of killed benchmarks (netns-hosts sweep)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)


def rma_path(env: Dict[str, str]) -> str:
    """How the MPI moves RMA between ranks of one host under `env`."""
    if network_forced(env) and "OMPI_MCA_pml" in env:
        chosen = ", ".join(f"{k[len('OMPI_MCA_'):]}={v}" for k, v in sorted(env.items())
                           if k in ("OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_osc"))
        tls = f", UCX_TLS={env['UCX_TLS']}" if "UCX_TLS" in env else ""
        return f"network (forced: Open MPI {chosen}{tls})"
    if network_forced(env):
        netmod = env.get("MPIR_CVAR_CH4_NETMOD", "default netmod")
        provider = env.get("FI_PROVIDER", "")
        rma = "MPICH active messages" if active_message_rma(env) else "the provider's RMA"
        return f"network (forced: MPIR_CVAR_NOLOCAL=1, {netmod}" + \
            (f", FI_PROVIDER={provider}" if provider else "") + f"; RMA as {rma})"
    return "shared memory between ranks of a host, network between hosts"


def async_progress(env: Dict[str, str]) -> str:
    """Whether the MPI library runs a progress thread (MPICH or Open MPI settings)."""
    if env.get("MPIR_CVAR_ASYNC_PROGRESS", "0") not in ("", "0"):
        return "on (MPIR_CVAR_ASYNC_PROGRESS)"
    if env.get("OMPI_MCA_opal_progress_thread", "0") not in ("", "0"):
        return "on (OMPI_MCA_opal_progress_thread)"
    return "off (waits drive progress themselves)"


def library_checks() -> List[Tuple[str, bool, str]]:
    """(check, passed, detail) for the MPI library and the extension's build."""
    out: List[Tuple[str, bool, str]] = []
    try:
        import mpi4py
        from mpi4py import MPI

        out.append(("mpi4py", True, f"{mpi4py.__version__}, MPI {MPI.Get_version()[0]}."
                                    f"{MPI.Get_version()[1]}"))
    except ImportError as exc:
        return [("mpi4py", False, f"cannot import mpi4py: {exc}")]
    from .._core.mpiabi import build_config, runtime_abi

    abi, version = runtime_abi()
    out.append(("MPI library loaded", True, f"{version} (ABI {abi})"))
    config = build_config()
    if config is None:
        out.append(("extension build", False, "no build record: reinstall asapmpi"))
        return out
    out.append(("extension built against", True, f"ABI {config.MPI_ABI} with "
                                                f"{config.MPICC}"))
    level = getattr(config, "OPTIMIZE", None)
    out.append(("extension optimized", True,
                "not recorded (an older build)" if level is None else
                f"-O{level}" + ("" if level == "3" else
                                " (ASAPMPI_OPTIMIZE): a development build; time nothing "
                                "with it, rebuild without ASAPMPI_OPTIMIZE for -O3")))
    out.append(("ABI match", abi == config.MPI_ABI,
                "yes" if abi == config.MPI_ABI else
                f"no: rebuild with MPICC=<the mpicc of {version}>"))
    try:
        from .. import _core  # noqa: F401  (the import runs the ABI check)

        out.append(("extension import", True, "asapmpi._core loads"))
    except Exception as exc:  # noqa: BLE001  (report whatever stops the import)
        out.append(("extension import", False, f"{type(exc).__name__}: {exc}"))
        return out
    out.append(("survive in place", True, survive_in_place()))
    return out


def survive_in_place() -> str:
    """Whether this MPI can survive a dead rank in place (fault_tolerance=True,
    docs/FAILURES.md), and how; an MPI that cannot is no failure of the installation:
    restarts work on every MPI."""
    from ..exchange import survive

    why = survive.refusal(at_run_time=False)
    if why:
        return f"no: {why}"
    return ("yes (ULFM): launch with mpiexec --with-ft ulfm and pass "
            "fault_tolerance=True to the Exchange (docs/FAILURES.md)")


def smoke() -> int:
    """Run inside a 2-rank job: 20 exchange steps with checksums, every value checked;
    rank 0 prints one tagged JSON line."""
    import numpy as np
    from mpi4py import MPI

    from ..exchange import Exchange

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.full(1 << 16, float(rank), dtype=np.float64)
    ok, detail = True, ""
    with Exchange(buf, graph="ring", sync="notify_ack", timeout=30, checksum=True) as ex:
        for k in range(20):
            ex.step()
            # two ranks, weights 1/2: both hold the mean from the first step on
            if size == 2 and not np.all(buf == 0.5):
                ok, detail = False, f"step {k + 1}: wrong values {buf[:2]}"
        stats = ex.stats
        transport = f"{ex.transport} ({ex.transport_report['reason']})"
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        same_host = local.Get_size()
        local.Free()
    # the memory model of the MPI's RMA windows, from a window of the put transport:
    # the smoke test's own transport may be messages, which have no window
    with Exchange(np.zeros(8), graph="ring", sync="notify_ack", timeout=30,
                  transport="put") as probe:
        model = probe.window.memory_model
    bad = sum(v for s in stats.values() for k, v in s.items() if k != "consistent")
    if bad:
        ok, detail = False, f"{bad} reads were not consistent: {stats}"
    if rank == 0:
        print(SMOKE_TAG + " " + json.dumps({"ok": ok, "detail": detail, "ranks": size,
                                            "memory_model": model,
                                            "transport": transport,
                                            "ranks_on_host": same_host}), flush=True)
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    """Print the report; 0 if every check passed."""
    if args.smoke:
        return smoke()
    from ..launch.ranks import find_mpiexec
    from ..launchers import flavour, network_env

    checks = library_checks()
    mpiexec = find_mpiexec()
    kind = flavour(mpiexec)
    env = dict(os.environ)
    if args.network:
        env.update(network_env(kind, args.network))
    checks.append(("RMA path", True, rma_path(env)))
    checks.append(("asynchronous progress", True, async_progress(env)))
    from ..device.support import device_checks

    checks.extend(device_checks())
    if all(ok for _, ok, _ in checks):
        checks.extend(_smoke_checks(mpiexec, env))
    # after the smoke test: its own files are gone or in use by then
    stale, leftovers = _leftovers(args.clean)
    if args.clean:
        from ..bench.hosts import sweep_orphans

        for line in sweep_orphans():            # emulated hosts of killed benchmarks
            print(f"asapmpi doctor: {line}")
    width = max(len(name) for name, _, _ in [*checks, stale])
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name.ljust(width)}  {detail}")
    # leftovers hold memory but do not stop asapmpi from working: a warning
    print(f"{'WARN' if leftovers and not args.clean else 'PASS'}  {stale[0].ljust(width)}  "
          f"{stale[2]}")
    passed = all(ok for _, ok, _ in checks)
    print("asapmpi doctor: " + ("every check passed" if passed else "some checks FAILED"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{"check": n, "passed": ok, "detail": d} for n, ok, d in checks]
                      + [{"check": stale[0], "passed": True, "detail": stale[2],
                          "files": leftovers, "removed": bool(args.clean)}], f, indent=2)
    return 0 if passed else 1


def _leftovers(clean: bool) -> Tuple[Tuple[str, bool, str], list]:
    """The stale shared-memory files check (asapmpi.launch.shm_leftovers), removing them with
    --clean: (check, True, detail) and the files."""
    from ..launch import shm_leftovers

    files = shm_leftovers.stale_files()
    what = shm_leftovers.summary(files)
    if clean:
        removed = shm_leftovers.clean(files)
        detail = f"removed {shm_leftovers.summary(removed)}" if removed else "none to remove"
    elif files:
        detail = (f"{what} in {shm_leftovers.SHM_DIR} of ended jobs; "
                  f"`asapmpi doctor --clean` removes them")
    else:
        detail = "none"
    return ("stale shared memory", True, detail), files


def _smoke_checks(mpiexec: str, env: Dict[str, str]) -> List[Tuple[str, bool, str]]:
    from ..launch.ranks import RANK_VARIABLES
    from ..launchers import command, flavour

    cmd, extra = command(flavour(mpiexec), mpiexec, 2,
                         [sys.executable, "-m", "asapmpi", "doctor", "--smoke"],
                         job_timeout=120)
    env = {k: v for k, v in env.items() if k not in RANK_VARIABLES}
    env.update(extra)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150,
                              check=False)
    except subprocess.TimeoutExpired:
        return [("2-rank smoke test", False, "hung for 150 s")]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(SMOKE_TAG)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [("2-rank smoke test", False, f"exit {proc.returncode}: {' | '.join(tail)}")]
    res = json.loads(lines[0][len(SMOKE_TAG):])
    return [("window memory model", True, res["memory_model"]),
            ("transport chosen (auto)", True, res["transport"]),
            ("ranks on one host", True, f"{res['ranks_on_host']} of {res['ranks']}"),
            ("2-rank smoke test", res["ok"],
             res["detail"] or "20 put/notify/verify steps, checksums, all values exact")]
