"""Channels-last convolutions: on by default for conv models, off for others, and a switch."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_shoal
from shoal.train.step import has_conv2d, in_channels_last
from shoal.workloads.synthetic import build_synthetic_model


def test_only_conv_models_default_to_channels_last():
    assert has_conv2d(build_synthetic_model("resnet18", 32))
    assert not has_conv2d(build_synthetic_model("mlp", 8))


def test_batches_move_to_channels_last_after_the_workload_transform():
    calls = []

    def transform(batch):
        calls.append(batch[0].shape)
        return batch[0] * 2, batch[1]

    images, labels = torch.randn(4, 3, 5, 5), torch.arange(4)
    inputs, targets = in_channels_last(transform)((images, labels))
    assert calls == [images.shape] and torch.equal(targets, labels)
    assert inputs.is_contiguous(memory_format=torch.channels_last) and not inputs.is_contiguous()
    assert torch.equal(inputs, images * 2)
    flat, _ = in_channels_last(None)((torch.randn(4, 10), labels))  # not images: left alone
    assert flat.is_contiguous()


def _train(out, *flags):
    return run_shoal(
        "train",
        "synthetic",
        "--arch",
        "resnet18",
        "--image-size",
        "16",
        "--samples",
        "64",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--out",
        str(out),
        *flags,
        timeout=240,
    )


@pytest.mark.multiprocess
def test_resnet_trains_in_channels_last_by_default_and_the_switch_turns_it_off(tmp_path):
    results = {}
    for name, flags in (("auto", ()), ("off", ("--no-channels-last",))):
        proc = _train(tmp_path / name, *flags)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        config = json.loads((tmp_path / name / "config.json").read_text())
        results[name] = config["extra"]["channels_last"]
        state = torch.load(tmp_path / name / "model.pt", weights_only=True)
        # The saved weights load into a fresh model in the ordinary memory format.
        fresh = build_synthetic_model("resnet18", 16)
        fresh.load_state_dict(state)
        assert all(torch.equal(p, state[k]) for k, p in fresh.state_dict().items())
    assert results == {"auto": True, "off": False}
