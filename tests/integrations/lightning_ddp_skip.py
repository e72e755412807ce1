"""One rank of a two-rank Lightning DDP run (gloo, CPU) that skips a step window from its
start: ``python lightning_ddp_skip.py RESULT CKPT_DIR`` with ``NODE_RANK`` 0 or 1 and the
rendezvous's ``MASTER_ADDR``/``MASTER_PORT`` set (tests/integrations/test_lightning.py)."""

from __future__ import annotations

import os
import sys

import lightning as L
import torch

from goodput import schemas
from goodput.integrations.lightning import GoodputCallback
from goodput.shim import BatchPlan, ShimConfig, TrainerShim
from goodput.shim.data_position import ResumableSampler
from tests.integrations.harness import SAMPLES, Indexed

#: the steps skipped, and every step the run takes
WINDOW, STEPS = schemas.StepWindow(3, 4), 8
PLAN = BatchPlan(global_batch=8, micro_batch=4, lr=1e-2)  # 4 per rank on 2 ranks


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        return self.net(batch[1]).square().mean()

    def configure_optimizers(self) -> object:
        optimizer = torch.optim.AdamW(self.parameters(), lr=PLAN.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


def main(result: str, ckpt_dir: str) -> None:
    rank = int(os.environ["NODE_RANK"])
    torch.manual_seed(0)
    config = ShimConfig(
        ckpt_dir=ckpt_dir, ckpt_every=50, rank=rank, world_size=2, skip_steps=(WINDOW,)
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    loader = torch.utils.data.DataLoader(
        Indexed(), batch_size=PLAN.micro_batch, sampler=ResumableSampler(SAMPLES, seed=3)
    )
    goodput = GoodputCallback(shim=shim, plan=PLAN, data=loader)
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy="ddp",
        callbacks=[goodput],
        plugins=[goodput.checkpoint_io],
        use_distributed_sampler=False,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Regression()
    trainer.fit(module, loader, ckpt_path=goodput.resume_path())
    state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    keys = ("state_dict", "optimizer_states", "lr_schedulers")
    torch.save({"step": trainer.global_step, **{k: state[k] for k in keys}}, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
