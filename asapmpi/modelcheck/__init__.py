"""Explicit-state model checking of the slot protocols (docs/MODELCHECK.md).

    explorer.py             explore(): every reachable state once, traces, deadlocks
    model.py                Model: state cells, symmetry reduction, common checks
    rma.py                  lazy window words and unordered puts
    onesided.py             OneSidedModel: steps, settles, landings (demand/spontaneous)
    verify.py               the verified reduce's loads and checks
    notify_ack_put.py       NOTIFY-ACK on the put transport
    notify_ack_shared.py    NOTIFY-ACK on the shared transport, single and double buffered
    notify_ack_messages.py  NOTIFY-ACK on the message transport
    hop.py                  Hop: rotating slots, tokens, backup, staleness, skipping
    mailbox.py              Hop and BSP on the mailbox (messages), free()'s drain,
                            dropped windows
    newest.py               the mailbox of newest versions (async, backup_ps, elastic),
                            its drain
    gossip_pull.py          gossip's pulls: publish, MPI_Rget, verify, copy
    gossip_push.py          gossip's pushes: MPI_Issend, a pool of receives, take,
                            reduce, release, the drain
    join.py                 join: the board's words, the loop, the agreement, the
                            epochs, over NOTIFY-ACK's step dependencies
    graphs.py               the small graphs, by spec ("ring:3", "offsets:6:1,4")
    scenarios.py            protocol x graph x bounds x variant, with expected verdicts
    cli.py                  `asapmpi check-protocol`
"""
from .explorer import Result, explore
from .scenarios import PROTOCOLS, SCENARIOS, Scenario, build, run, select

__all__ = ["PROTOCOLS", "SCENARIOS", "Result", "Scenario", "build", "explore", "run",
           "select"]
