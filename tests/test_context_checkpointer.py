"""``ctx.checkpointer(sharded=, async_save=)``: the library's door to sharded (DCP) checkpoints."""

import torch
from torch import nn

import shoal


def _stepped():
    model = nn.Linear(3, 3)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_an_async_sharded_save_resumes_the_same_model_and_optimizer(tmp_path):
    ctx = shoal.init(device="cpu")
    try:
        model, optimizer = _stepped()
        ckpt = ctx.checkpointer(str(tmp_path), sharded=True, async_save=True)
        ckpt.save(epoch=0, step=1, objects={"model": model, "optimizer": optimizer}, extra={"epoch": 0})
        ckpt.wait()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-e00000-s000000001.dcp", "latest"]
        fresh = nn.Linear(3, 3)
        fresh_optimizer = torch.optim.Adam(fresh.parameters())
        found = ctx.checkpointer(str(tmp_path)).resume({"model": fresh, "optimizer": fresh_optimizer})
        assert found.step == 1 and found.extra["epoch"] == 0
        assert torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
        saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
        assert all(torch.equal(saved[i]["exp_avg"], loaded[i]["exp_avg"]) for i in saved)
    finally:
        ctx.shutdown()
