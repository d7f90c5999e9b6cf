"""Benchmark: our attention ViT against timm's DeiT-Ti in one process, the anchor of the CPU wall (not a test).

    python -m experiments.bench.anchor                         # 224 px, patch 16, batch 1 and 32, fp32
    python -m experiments.bench.anchor --threads 2 --csv results/cpu_wall/anchor.csv

Both models have DeiT-Ti's shape (dim 192, depth 12, 3 heads, MLP ratio 4); ours pools the tokens where DeiT
reads a class token (196 tokens against 197). Each case times the two models in alternating rounds with the
sweep's protocol (warm-up, repeats until a count and a time are reached, median), so a load that comes and goes
touches both; the table gives each model's median over rounds and the ratio ours / timm's per round. The models
are built untrained (timm's `pretrained=False`): nothing is downloaded.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from models import create_vit

from ..measure.timing import TimingProtocol, time_call
from .cli import Parser, int_at_least, positive_float
from .record import provenance_columns, provenance_line, write_rows

TIMM_NAME = "deit_tiny_patch16_224"


def anchor_models(img_size: int) -> dict[str, torch.nn.Module]:
    """Ours (attention, tiny preset) and timm's DeiT-Ti at `img_size`, patch 16, seed 0, in eval mode."""
    import timm

    torch.manual_seed(0)
    ours = create_vit("tiny", mixer="attention", img_size=img_size, patch_size=16)
    torch.manual_seed(0)
    theirs = timm.create_model(TIMM_NAME, pretrained=False, img_size=img_size)
    return {"mixerbench attention tiny": ours.eval(), f"timm {TIMM_NAME}": theirs.eval()}


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python -m experiments.bench.anchor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--img-size", type=int_at_least(16, 4096), default=224,
                        help="input side in pixels, a multiple of 16 (default 224, DeiT's)")
    parser.add_argument("--batches", type=int_at_least(1, 4096), nargs="+", default=[1, 32],
                        help="batch sizes, each a case (default: 1 for latency, 32 for throughput)")
    parser.add_argument("--threads", type=int_at_least(1, 4096), default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int_at_least(1, 100), default=9,
                        help="alternating rounds per case (default 9: on a shared 2-core VM three rounds spread as "
                             "wide as the 5%% the anchor is read against)")
    parser.add_argument("--min-time-s", type=positive_float, default=2.0,
                        help="seconds each model is timed per round, at least (default 2)")
    parser.add_argument("--csv", type=Path, default=None, help="also write the rows, with provenance, here")
    args = parser.parse_args(argv)
    if args.img_size % 16:
        parser.error(f"--img-size {args.img_size} is not a multiple of the patch size 16")
    if args.csv is not None and args.csv.is_dir():
        parser.error(f"--csv {args.csv} is a folder; give a file path")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    protocol = TimingProtocol(warmup=2, min_repeats=5, min_time_s=args.min_time_s)
    models = anchor_models(args.img_size)
    columns = provenance_columns(device, args.rounds)
    print(f"{args.img_size} px, patch 16, fp32, {args.threads} threads, inference; {provenance_line(columns, 'rounds')}")
    print("| batch | model | params | median ms (over rounds) | img/s | ours / timm's per round |\n|---|---|---|---|---|---|")
    rows = []
    for batch in args.batches:
        x = torch.randn(batch, 3, args.img_size, args.img_size)
        medians: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.rounds):
            for name, model in models.items():
                def forward(model: torch.nn.Module = model) -> None:
                    with torch.inference_mode():
                        model(x)

                medians[name].append(time_call(forward, device, protocol).median_ms)
        ours, theirs = medians.values()
        ratios = [a / b for a, b in zip(ours, theirs)]
        for name, model in models.items():
            median = statistics.median(medians[name])
            params = sum(p.numel() for p in model.parameters())
            ratio = " ".join(f"{r:.3f}" for r in ratios) if name == next(iter(models)) else ""
            print(f"| {batch} | {name} | {params:,} | {median:.1f} | {batch / median * 1e3:.1f} | {ratio} |")
            rows.append({"img_size": args.img_size, "patch_size": 16, "batch_size": batch, "model": name,
                         "params": params, "latency_ms": round(median, 3),
                         "round_latencies_ms": " ".join(f"{m:.3f}" for m in medians[name]),
                         "threads": args.threads, "dtype": "float32", **columns})
    if args.csv is not None:
        print(f"wrote {write_rows(args.csv, rows)}")


if __name__ == "__main__":
    main()
