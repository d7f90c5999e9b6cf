"""The device trainer's CUDA-only branches on a CPU, through their seams: the fused AdamW it builds for CUDA
(and for the CPU, whose fused kernel steps here, against the foreach one other devices get), and the CUDA RNG
state a checkpoint saves and restores, with a stand-in for torch.cuda (issue 34)."""
from __future__ import annotations

import io

import torch
from torch import nn

from experiments.train.device_trainer import make_optimizer, restore_rng_state, rng_state
from experiments.train.recipe import TrainRecipe

CUDA = torch.device("cuda")


class FakeCudaRng:
    """torch.cuda's RNG state API for one device, holding a state as torch.cuda does (a CPU uint8 tensor)."""

    def __init__(self) -> None:
        self.state = torch.arange(16, dtype=torch.uint8)
        self.devices: list[torch.device] = []

    def get_rng_state(self, device: torch.device) -> torch.Tensor:
        self.devices.append(device)
        return self.state.clone()

    def set_rng_state(self, state: torch.Tensor, device: torch.device) -> None:
        self.devices.append(device)
        self.state = state.clone()


def test_cuda_and_the_cpu_get_the_fused_adamw_and_it_steps_like_foreach() -> None:
    torch.manual_seed(0)
    fused_model, foreach_model = nn.Linear(4, 3), nn.Linear(4, 3)
    foreach_model.load_state_dict(fused_model.state_dict())
    recipe = TrainRecipe(epochs=1)
    fused = make_optimizer(fused_model, recipe, CUDA)
    assert fused.defaults["fused"] is True and not fused.defaults["foreach"]
    assert make_optimizer(fused_model, recipe, torch.device("cpu")).defaults["fused"] is True
    foreach = make_optimizer(foreach_model, recipe, torch.device("meta"))  # elsewhere: the foreach one
    assert foreach.defaults["foreach"] is True and not foreach.defaults["fused"]
    x = torch.randn(8, 4)
    for model, optimizer in ((fused_model, fused), (foreach_model, foreach)):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(fused_model.parameters(), foreach_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # fp32, two kernels' own operation orders


def test_cuda_rng_state_survives_a_checkpoint_round_trip() -> None:
    """Saved beside the CPU state, written and read as `weights_only` allows (tensors only), put back on the
    training device."""
    cuda = FakeCudaRng()
    saved = rng_state(CUDA, cuda)
    assert torch.equal(saved["rng_cuda"], torch.arange(16, dtype=torch.uint8)) and cuda.devices == [CUDA]
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu", weights_only=True)
    cuda.state = torch.zeros(16, dtype=torch.uint8)  # the run moved on
    torch.manual_seed(123)
    restore_rng_state(loaded, CUDA, cuda)
    assert torch.equal(cuda.state, torch.arange(16, dtype=torch.uint8)) and cuda.devices == [CUDA, CUDA]
    assert torch.equal(torch.get_rng_state(), saved["rng_cpu"])


def test_off_cuda_no_device_state_is_saved_or_restored() -> None:
    cuda = FakeCudaRng()
    saved = rng_state(torch.device("cpu"), cuda)
    assert saved["rng_cuda"] is None
    restore_rng_state(saved, torch.device("cpu"), cuda)
    restore_rng_state({**saved, "rng_cuda": None}, CUDA, cuda)  # a CPU checkpoint resumed on a GPU
    assert cuda.devices == []
