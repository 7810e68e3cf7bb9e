"""A small GPT-2 trained by Hugging Face's Trainer on every rank, mixed through asapmpi.

Each rank's Trainer trains its shard of a synthetic corpus (arithmetic token
sequences) with AdamW wrapped in a DecentralizedOptimizer; rank 0 logs.  The model is
built from a config: no hub access.  With --check-resume the run saves a checkpoint
halfway, and a second Trainer resumes from it: its final weights must equal the
uninterrupted run's, bit for bit (under notify_ack every run is deterministic).

    .venv/bin/mpiexec -n 4 .venv/bin/python examples/hf_trainer.py [--out DIR]
        [--steps 60] [--sync notify_ack] [--check-resume] [--json summary.json]
"""
import argparse
import json
import os
import tempfile

import torch
from mpi4py import MPI
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import asapmpi.torch.hf as asap_hf  # before TrainingArguments: keeps accelerate to one process


class Sequences(torch.utils.data.Dataset):
    """Token sequences start, start + step, start + 2 step, ... (mod 256)."""

    def __init__(self, n: int, seed: int, length: int = 32):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, 256, (n, 1), generator=g)
        step = torch.randint(1, 8, (n, 1), generator=g)
        self.tokens = (start + step * torch.arange(length)) % 256

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def model() -> GPT2LMHeadModel:
    """A two-layer GPT-2 of 64-wide embeddings over 256 tokens (the same on every rank;
    the optimizer broadcasts rank 0's weights anyway)."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256,
                                      n_positions=32, bos_token_id=0, eos_token_id=0))


def trainer(out: str, steps: int, sync: str, save_every: int = 0):
    """A DecentralizedTrainer over this rank's shard of 962 sequences (241 each on 4
    ranks: two shards end with a repeated one, as DistributedSampler pads)."""
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=16,
                             max_steps=steps, learning_rate=3e-3, warmup_steps=5,
                             logging_steps=max(steps // 4, 1), report_to=[], seed=7,
                             save_strategy="steps" if save_every else "no",
                             save_steps=save_every or 500, use_cpu=True,
                             disable_tqdm=True)
    return asap_hf.DecentralizedTrainer(model=model(), args=args,
                                        train_dataset=Sequences(962, seed=1),
                                        eval_dataset=Sequences(200, seed=2), sync=sync,
                                        graph=None if sync in ("allreduce", "gossip")
                                        else "root-expander")


def weights(t) -> torch.Tensor:
    """The replica's weights, flat (float32)."""
    return torch.cat([p.detach().float().reshape(-1) for p in t.model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="output folder (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sync", default="notify_ack")
    parser.add_argument("--check-resume", action="store_true")
    parser.add_argument("--json", help="rank 0 writes the summary here")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    out = args.out or comm.bcast(tempfile.mkdtemp(prefix="asapmpi-hf-") if comm.rank == 0
                                 else None)
    half = args.steps // 2 if args.check_resume else 0
    first = trainer(out, args.steps, args.sync, save_every=half)
    result = first.train()
    losses = [e["loss"] for e in first.state.log_history if "loss" in e]
    evaluated = first.evaluate()["eval_loss"]
    mine = weights(first)
    # the replicas agree up to the last mixes' rounding: the largest gap to rank 0's
    gap = float((mine - torch.from_numpy(comm.bcast(mine.numpy(), root=0))).abs().max())
    summary = {"ranks": comm.size, "sync": args.sync, "steps": result.global_step,
               "loss_first": losses[0], "loss_last": losses[-1], "eval_loss": evaluated,
               "replica_gap": comm.allreduce(gap, op=MPI.MAX),
               # the gap the average at the end of training closed
               "replica_gap_before_average": comm.allreduce(first.replica_gap, op=MPI.MAX),
               "rank_dir": os.path.basename(first.args.output_dir)}
    if args.check_resume:
        again = trainer(out, args.steps, args.sync, save_every=half)
        again.train(resume_from_checkpoint=os.path.join(first.args.output_dir,
                                                        f"checkpoint-{half}"))
        exact = bool(torch.equal(weights(again), mine))
        summary["resume_exact"] = all(comm.allgather(exact))
    if comm.rank == 0:
        print(json.dumps(summary), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)


if __name__ == "__main__":
    main()
