"""DecentralizedOptimizer: any torch.optim optimizer plus an asapmpi Exchange.

    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                 momentum=0.9),
                                 graph="root-expander", sync="notify_ack", period=1)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()            # apply the gradients, and every `period` steps mix the
                              # parameters with the neighbours'

The optimizer's parameters are moved into one flat buffer (FlatParameters) that the
Exchange sends from and reduces into, zero-copy.  On one host the Exchange is
double-buffered: the parameters live in its shared memory and move between its two
buffers at every mix (no copy at all); `free()` brings them back to private memory.

Two computation graphs (Hop section 3.2):

- serial (default): Compute, Appl, Send, Rec, Reduce: gradients are computed on and
  applied to the same parameters;
- parallel: Send at the start of an iteration, Compute on the same parameters, then Rec,
  Reduce, and Appl the gradients to the reduced parameters: the neighbours' transfers
  overlap the compute, at the price of gradients computed on pre-reduce parameters.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch
from mpi4py import MPI

import asapmpi
from asapmpi.errors import ConfigError

from .flat import FlatParameters

MODES = ("serial", "parallel")
#: optimizer steps between two checks that the parameters still live in the buffer
CHECK_EVERY = 64


def _no_step(closure=None):
    return None


def broadcast_parameters(flat: FlatParameters, comm: Optional[MPI.Comm] = None,
                         root: int = 0) -> None:
    """Give every rank `root`'s parameters (one MPI_Bcast of the flat buffer)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    comm.Bcast(flat.array, root=root)


class DecentralizedOptimizer:
    """Wrap `optimizer` so that its step also mixes the parameters over an Exchange.

    optimizer: any torch.optim.Optimizer; its parameters (all groups) are exchanged.
    graph, sync, weights, timeout, checksum, policy options: as asapmpi.Exchange.
        sync="backup_ps": the server rank only averages (its optimizer never steps);
        the workers' steps are averaged at the server.
    period: mix every `period` optimizer steps (1 = every step).
    mode: "serial" or "parallel" (module docstring).
    broadcast: start every rank from rank 0's parameters (default True).
    comm: the communicator (default COMM_WORLD).
    double_buffer: as asapmpi.Exchange (default True here: the parameters' storage
        alternates between the exchange's two buffers; the Parameter objects stay).

    Creating, freeing and the first step are collective.  `iteration` counts optimizer
    steps, including those a Hop worker skipped when it jumped ahead.  It is not a
    torch.optim.Optimizer: give learning-rate schedulers `opt.optimizer`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, graph=None,
                 sync: str = "notify_ack", *, period: int = 1, mode: str = "serial",
                 broadcast: bool = True, comm: Optional[MPI.Comm] = None, **exchange_options):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, got "
                              f"{type(optimizer).__name__}")
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ConfigError(f"period must be an integer >= 1, got {period!r}")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        self.optimizer = optimizer
        self.period = period
        self.mode = mode
        self.comm = MPI.COMM_WORLD if comm is None else comm
        problem = None
        try:
            self.flat = FlatParameters(p for g in optimizer.param_groups for p in g["params"])
        except ConfigError as exc:
            problem = str(exc)
        # one rank's bad parameters or a period that differs across ranks must fail on
        # every rank, before the Exchange's own collective checks could wait for it
        seen = self.comm.allgather((problem, period, mode))
        for r, (p, _, _) in enumerate(seen):
            if p:
                raise ConfigError(p if r == self.comm.Get_rank() else f"rank {r}: {p}")
        if len({(per, m) for _, per, m in seen}) > 1:
            shown = ", ".join(f"rank {r}: period={per} mode={m}"
                              for r, (_, per, m) in enumerate(seen))
            raise ConfigError(f"every rank must pass the same period and mode; got {shown}")
        exchange_options.setdefault("double_buffer", True)
        self.exchange = asapmpi.Exchange(self.flat.array, graph, sync, self.comm,
                                         **exchange_options)
        self.flat.rehome(self.exchange.buffer)
        if self.exchange.global_iterations and (period != 1 or mode != "serial"):
            self.exchange.free()
            raise ConfigError(f"sync={sync!r} decides itself when each worker synchronizes: "
                              f"use period=1 and mode='serial'")
        if broadcast:
            broadcast_parameters(self.flat, self.exchange.comm)
        self.iteration = 0
        self._sent = False
        self._bytes_before_send = 0

    # ------------------------------------------------------------------ training

    @property
    def param_groups(self):
        """The wrapped optimizer's parameter groups (learning rates live here)."""
        return self.optimizer.param_groups

    @property
    def state(self):
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, as torch.optim.Optimizer.zero_grad."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _mixes(self, iteration: int) -> bool:
        return iteration % self.period == 0

    def step(self, closure=None):
        """One optimizer step (iteration + 1); on every `period`-th, the exchange too.
        Returns what the wrapped optimizer's step returned (the closure's loss)."""
        target = self.iteration + 1
        if target % CHECK_EVERY == 1:
            # a parameter re-homed since (p.data = ...) would no longer mix; checking
            # loops over every parameter, so not on every step
            self.flat.check()
        # a parameter server only averages what its workers send: no optimizer step
        apply = self.optimizer.step if self.exchange.role != "server" else _no_step
        if self.mode == "serial":
            loss = apply(closure)
            if self._mixes(target):
                self.flat.rehome(self.exchange.step())
        else:
            if self._mixes(target):
                if not self._sent:      # first iteration (or after a resume): send now
                    self.exchange.send()
                # the gradients were computed on the sent buffer; Appl updates the result
                self.flat.rehome(self.exchange.receive())
                self._sent = False
            loss = apply(closure)
            if self._mixes(target + 1):
                # Send(k+1) at the start of the next iteration, before its Compute
                self._bytes_before_send = self.exchange.bytes_sent
                self.exchange.send()
                self._sent = True
        self.iteration = target
        if self.exchange.global_iterations:
            # between supersteps the global count stands still while workers step on
            self.iteration = self.exchange.version
        elif self._mixes(target):
            # a Hop worker that jumped ahead has completed more exchanges than steps
            self.iteration = max(self.iteration, self.exchange.version * self.period)
        return loss

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's state_dict plus the iteration and the exchange state
        (the parameters themselves are the model's: save model.state_dict() too)."""
        exchange = self.exchange.state_dict()
        if self._sent:
            # parallel mode: Send(k+1) is out already; a resumed run sends it again
            # (it restarts from these parameters), so it is not counted here
            exchange["bytes_sent"] = self._bytes_before_send
        return {"optimizer": self.optimizer.state_dict(), "exchange": exchange,
                "iteration": self.iteration, "period": self.period, "mode": self.mode}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from state_dict(); before the first step, on every rank alike."""
        for key in ("optimizer", "exchange", "iteration", "period", "mode"):
            if key not in state:
                raise ConfigError(f"optimizer state has no {key!r}; pass what "
                                  f"DecentralizedOptimizer.state_dict() returned")
        if (state["period"], state["mode"]) != (self.period, self.mode):
            raise ConfigError(f"the checkpoint was written with period={state['period']}, "
                              f"mode={state['mode']!r}; this optimizer has "
                              f"period={self.period}, mode={self.mode!r}")
        self.exchange.load_state_dict(state["exchange"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
        self.flat.check()

    # ------------------------------------------------------------------ lifetime

    def free(self) -> None:
        """Free the exchange (collective); the parameters end in private memory."""
        self.exchange.free()
        # free() copied the final values into the buffer the exchange was created with
        self.flat.rehome(self.flat.home)
        self.flat.forget_other_homes()

    def __enter__(self) -> "DecentralizedOptimizer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # as Exchange: no collective free while an exception propagates
        if exc_type is None:
            self.free()

    def __repr__(self):
        return (f"DecentralizedOptimizer({type(self.optimizer).__name__}, "
                f"sync={self.exchange.sync!r}, mode={self.mode!r}, period={self.period}, "
                f"iteration {self.iteration})")
