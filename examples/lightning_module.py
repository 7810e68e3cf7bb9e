"""A LightningModule trained on every rank by PyTorch Lightning, mixed through asapmpi.

Each rank's Trainer runs DecentralizedStrategy: its DistributedSampler shard of a
synthetic classification task (a random teacher network's labels), SGD with momentum
and a step schedule wrapped in a DecentralizedOptimizer, validation loss averaged over
the ranks (sync_dist), a checkpoint per epoch in each rank's folder.  With
--check-resume a second Trainer resumes from the checkpoint of the middle epoch: its
final weights must equal the uninterrupted run's, bit for bit (notify_ack).

    .venv/bin/mpiexec -n 4 .venv/bin/python examples/lightning_module.py [--out DIR]
        [--epochs 4] [--sync notify_ack] [--check-resume] [--json summary.json]
"""
import argparse
import glob
import json
import os
import tempfile

import lightning
import torch
from mpi4py import MPI

from asapmpi.torch.lightning import DecentralizedStrategy


def data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """n examples of 32 features labelled by a fixed random teacher (seed 0)."""
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Tanh(),
                                  torch.nn.Linear(16, 4))
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
        x = torch.randn(n, 32, generator=torch.Generator().manual_seed(seed))
        return torch.utils.data.TensorDataset(x, teacher(x).argmax(1))


class Classifier(lightning.LightningModule):
    """An MLP with BatchNorm (its statistics are mixed as well)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.losses = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y),
                 sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)]


def fit(out: str, epochs: int, sync: str, ckpt_path=None):
    """Fit a fresh Classifier for `epochs` epochs; returns (module, trainer)."""
    module = Classifier()
    trainer = lightning.Trainer(
        strategy=DecentralizedStrategy(sync=sync, graph=None if sync in (
            "allreduce", "gossip") else "root-expander"),
        accelerator="cpu", devices=1, max_epochs=epochs, default_root_dir=out,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[lightning.pytorch.callbacks.ModelCheckpoint(
            dirpath=os.path.join(out, "checkpoints"), save_top_k=-1,
            filename="{epoch}")])
    loader = torch.utils.data.DataLoader(data(2000, seed=1), batch_size=32, shuffle=True)
    val = torch.utils.data.DataLoader(data(512, seed=2), batch_size=64)
    trainer.fit(module, loader, val, ckpt_path=ckpt_path)
    return module, trainer


def weights(module) -> torch.Tensor:
    """The replica's parameters and buffers, flat."""
    return torch.cat([t.detach().double().reshape(-1) for t in module.state_dict().values()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="output folder (default: a temporary one)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--sync", default="notify_ack")
    parser.add_argument("--check-resume", action="store_true")
    parser.add_argument("--json", help="rank 0 writes the summary here")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    lightning.seed_everything(7, verbose=False)
    out = args.out or comm.bcast(tempfile.mkdtemp(prefix="asapmpi-lightning-")
                                 if comm.rank == 0 else None)
    module, trainer = fit(out, args.epochs, args.sync)
    mine = weights(module)
    gap = float((mine - torch.from_numpy(comm.bcast(mine.numpy(), root=0))).abs().max())
    steps = len(module.losses)
    summary = {"ranks": comm.size, "sync": args.sync, "steps": steps,
               "loss_first": sum(module.losses[:10]) / 10,
               "loss_last": sum(module.losses[-10:]) / 10,
               "val_loss": float(trainer.callback_metrics["val_loss"]),
               "replica_gap": comm.allreduce(gap, op=MPI.MAX),
               # the gap the average at the end of training closed
               "replica_gap_before_average": comm.allreduce(trainer.strategy.replica_gap,
                                                            op=MPI.MAX),
               "checkpoints": sorted(os.path.relpath(p, out) for p in glob.glob(
                   os.path.join(out, "checkpoints", "*", "*.ckpt")))}
    if args.check_resume:
        lightning.seed_everything(7, verbose=False)
        middle = os.path.join(out, "checkpoints", "rank00000",
                              f"epoch={args.epochs // 2 - 1}.ckpt")
        again, _ = fit(out, args.epochs, args.sync, ckpt_path=middle)
        summary["resume_exact"] = all(comm.allgather(bool(torch.equal(weights(again), mine))))
    if comm.rank == 0:
        print(json.dumps(summary), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)


if __name__ == "__main__":
    main()
