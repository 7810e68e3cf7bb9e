"""`asapmpi graph`: what a communication graph costs and how well it mixes, before
training on it.

    asapmpi graph root-expander -n 25 --model-size 4M --png g.png
    asapmpi graph --file my_graph.txt --model-size 100M
    asapmpi graph --list
"""
from __future__ import annotations

import argparse
from typing import List

import numpy as np

from ..errors import ConfigError
from ..outputs import output_file
from ..reduce import (
    DESCRIPTIONS,
    GRAPHS,
    Graph,
    graph,
    load,
    mixing_matrix,
    second_singular_value,
    spectral_gap,
)
from ..reduce.weights import check_stochastic

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """'4M' -> 4194304; plain numbers are bytes."""
    token = text.strip().upper().removesuffix("B")
    mult = _UNITS.get(token[-1:], 1)
    digits = token[:-1] if token[-1:] in _UNITS else token
    try:
        value = int(float(digits) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; write e.g. 4096, 64K, 4M") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `asapmpi graph`."""
    parser.add_argument("name", nargs="?", help="graph name (see --list)")
    parser.add_argument("-n", "--ranks", type=int, help="number of ranks")
    parser.add_argument("--list", action="store_true", help="list the graphs and exit")
    parser.add_argument("--file", help="read a user graph (edge list text or .npy matrix)")
    parser.add_argument("--model-size", type=parse_bytes, default=None,
                        help="bytes each rank exchanges (e.g. 4M): prints bytes on the wire")
    parser.add_argument("--weights", default="auto", choices=["auto", "uniform", "metropolis"],
                        help="mixing weights (default auto)")
    parser.add_argument("--ranks-per-host", type=int, help="hierarchical: ranks per host")
    parser.add_argument("--degree", type=int, help="random-regular: degree")
    parser.add_argument("--seed", type=int, default=0, help="random-regular: seed")
    parser.add_argument("--png", type=output_file, help="draw the graph to this PNG file")


def _human(nbytes: float) -> str:
    for unit, mult in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= mult:
            return f"{nbytes / mult:.2f} {unit}"
    return f"{nbytes:.0f} B"


def _build(args: argparse.Namespace) -> Graph:
    if args.file:
        return load(args.file)
    if not args.name:
        raise ConfigError("name a graph (asapmpi graph --list) or pass --file")
    if args.ranks is None:
        raise ConfigError("pass the number of ranks with -n")
    params = {}
    if args.name == "hierarchical":
        params["ranks_per_host"] = args.ranks_per_host
    if args.name == "random-regular":
        params.update(degree=args.degree, seed=args.seed)
    return graph(args.name, args.ranks, **params)


def describe(g: Graph, weights: str = "auto", model_size=None) -> List[str]:
    """The report lines for graph g."""
    outs = [g.out_degree(r) for r in range(g.n)]
    ins = [g.in_degree(r) for r in range(g.n)]
    lines = [f"graph {g.name} on {g.n} ranks, {len(g.edges())} edges",
             f"  out-degree  min {min(outs)}  max {max(outs)}  mean {np.mean(outs):.2f}",
             f"  in-degree   min {min(ins)}  max {max(ins)}  mean {np.mean(ins):.2f}"]
    if model_size:
        busiest, total = max(outs) * model_size, len(g.edges()) * model_size
        lines.append(f"  bytes sent per reduce: {_human(busiest)} by the busiest rank "
                     f"({max(outs)} x {_human(model_size)}), {_human(total)} in all "
                     f"(a ring all-reduce moves about {_human(2 * model_size)} per rank)")
    yes = {True: "yes", False: "no"}
    lines.append(f"  strongly connected: {yes[g.is_strongly_connected()]}   regular: "
                 f"{yes[g.is_regular()]}   undirected: {yes[g.is_undirected()]}")
    lines.append(f"  spectral gap: asap 1 - sigma2(P) = {spectral_gap(g, 'asap'):.4f}   "
                 f"hop |l1(W)| - |l2(W)| = {spectral_gap(g, 'hop'):.4f}")
    try:
        w = mixing_matrix(g, weights)
        check_stochastic(w)
        s2 = second_singular_value(w)
        lines.append(f"  weights {weights}: doubly stochastic; the disagreement shrinks by at "
                     f"least x{s2:.4f} per step (sigma2 of W)")
    except ConfigError as exc:
        lines.append(f"  weights {weights}: not usable for training: {exc}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run `asapmpi graph`."""
    if args.list:
        width = max(map(len, GRAPHS))
        for name in GRAPHS:
            print(f"{name.ljust(width)}  {DESCRIPTIONS[name]}")
        return 0
    g = _build(args)
    print("\n".join(describe(g, args.weights, args.model_size)))
    if args.png:
        from ..plot.graph_png import draw_graph

        draw_graph(g.n, g.edges(), args.png, title=f"{g.name}, {g.n} ranks")
        print(f"  drawn to {args.png}")
    return 0
