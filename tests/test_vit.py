"""The backbone: shapes for every mixer, presets, analytic MACs against the counter, and its error messages."""
from __future__ import annotations

import pytest
import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from margins import clearly_non_zero, largest
from mixers import list_mixers
from models import PRESETS, create_vit, resolve_img_size


@pytest.mark.parametrize("mixer", list_mixers())
@pytest.mark.parametrize("img_size,patch_size", [(32, 4), ((24, 40), 8), (8, 8)])
def test_forward_shape_and_macs(mixer: str, img_size, patch_size: int) -> None:
    model = create_vit("micro", mixer=mixer, img_size=img_size, patch_size=patch_size, num_classes=7, depth=2).eval()
    h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
    x = torch.randn(2, 3, h, w)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        logits = model(x)
    assert logits.shape == (2, 7)
    assert model.macs() == counter.get_total_flops() // 2 // 2  # two images, FLOPs = 2 x MACs
    assert model.impl


@pytest.mark.parametrize("mixer", list_mixers())
def test_training_step_reaches_every_parameter(mixer: str) -> None:
    model = create_vit("micro", mixer=mixer, img_size=16, patch_size=4, num_classes=3, depth=2).double()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(2, 3, 16, 16, dtype=torch.float64)),
                                             torch.tensor([0, 2]))
    loss.backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None]
    scale = largest([p.grad for p in model.parameters()])
    # A mixer blind to a per-channel shift (its declared, contract-checked invariance) hides the bias of the norm
    # feeding it: that gradient is zero by the mathematics, so it alone is excused (mixers/base.py).
    excused = {f"blocks.{i}.norm1.bias" for i, block in enumerate(model.blocks)
               if "channel_shift" in block.mixer.invariant_to}
    assert not [n for n, p in model.named_parameters() if n not in excused and not clearly_non_zero(p.grad, scale)]


def test_presets_match_deit_shapes() -> None:
    assert (PRESETS["tiny"].dim, PRESETS["tiny"].depth, PRESETS["tiny"].num_heads) == (192, 12, 3)
    assert (PRESETS["small"].dim, PRESETS["small"].depth, PRESETS["small"].num_heads) == (384, 12, 6)
    assert (PRESETS["base"].dim, PRESETS["base"].depth, PRESETS["base"].num_heads) == (768, 12, 12)
    ours = create_vit("tiny", mixer="attention", img_size=224, patch_size=16)
    deit_ti = timm.create_model("deit_tiny_patch16_224", pretrained=False)
    # Same shape as timm's DeiT-Ti but for its class token and that token's position embedding.
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(ours) == count(deit_ti) - 2 * 192


def test_mixer_only_blocks() -> None:
    model = create_vit("tiny", mixer="attention", img_size=32, patch_size=16, depth=2, mlp_ratio=0)
    assert not any("mlp" in name for name, _ in model.named_parameters())


def test_patch_size_must_divide_the_image() -> None:
    with pytest.raises(ValueError, match="patch_size 16 does not divide img_size 225.*nearest: 224 or 240"):
        create_vit("micro", mixer="attention", img_size=225, patch_size=16)
    with pytest.raises(ValueError, match="nearest: 16"):
        resolve_img_size(8, 16)


def test_unknown_preset_and_override() -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose one of: micro, tiny"):
        create_vit("huge", mixer="attention")
    with pytest.raises(ValueError, match="unknown ViT override.*dpeth.*valid:.*depth"):
        create_vit("micro", mixer="attention", dpeth=3)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        create_vit("micro", mixer="attention", depth=0)


def test_the_head_reads_the_tokens_by_mean_or_by_max() -> None:
    torch.manual_seed(0)
    mean = create_vit("micro", mixer="attention", img_size=16, patch_size=4, num_classes=3, depth=1).eval()
    peak = create_vit("micro", mixer="attention", img_size=16, patch_size=4, num_classes=3, depth=1, pool="max").eval()
    peak.load_state_dict(mean.state_dict())  # pooling has no parameters: one state dict serves both
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        features = mean.forward_features(x)  # (B, N, C)
        assert torch.equal(mean(x), mean.head(features.mean(dim=1)))
        assert torch.equal(peak(x), peak.head(features.amax(dim=1)))
    with pytest.raises(ValueError, match="pool must be one of mean, max, got 'avg'"):
        create_vit("micro", mixer="attention", pool="avg")


def test_the_residual_stream_is_token_major() -> None:
    """Every block gets and gives contiguous (B, N, C) tokens. The patch embedding's (B, N, C) is a view of the
    conv's (B, C, H, W), channels strided by N; carried into the residual stream, every norm copied it and every
    add ran strided, a cost every mixer paid."""
    model = create_vit("micro", mixer="identity", img_size=32, patch_size=4, num_classes=3, depth=2).eval()
    layouts = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda module, args: layouts.append(args[0].is_contiguous()))
        block.register_forward_hook(lambda module, args, out: layouts.append(out.is_contiguous()))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert layouts == [True] * 4
