"""Exchange: mix one buffer with the neighbours' copies over one-sided MPI.

    with asapmpi.Exchange(params, graph="root-expander", sync="notify_ack") as ex:
        for batch in data:
            train_step(params, batch)
            ex.step()        # params = w_self*params + sum_i w_i * params of in-neighbour i

With double_buffer=True the exchange keeps the buffer in its own shared memory and
step() returns where the result is (use that array from then on):

    with asapmpi.Exchange(params, double_buffer=True) as ex:
        x = ex.buffer
        for batch in data:
            train_step(x, batch)
            x = ex.step()
    # params holds the final values again

Creation is collective over `comm`.  Every rank checks its own input, then one
allgather shares what each rank was given; from it every rank builds the same global
graph and mixing matrix and runs the same checks, so bad input on any rank raises the
same ConfigError on every rank before any one-sided communication starts.

The package, one job a module:

    checks.py        what each rank checks on its own input (no communication)
    agreement.py     the allgather of what each rank was given; the graph and mixing
                     matrix every rank builds identically from it
    choice.py        the transport: asked for, the only one that fits, or measured
    probe.py         transport="auto"'s measurement
    construction.py  the slot window of the chosen channel
    exchange.py      the Exchange: steps, state, lifetime
"""
from .checks import GraphSpec
from .exchange import Exchange

__all__ = ["Exchange", "GraphSpec"]
