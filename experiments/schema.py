"""The columns of `runs.csv`: a public interface, documented in results/README.md.

One row per measured point, long format. Units are in the column names or stated here. The report reads
only these files, so this module imports nothing heavier than the standard library.
"""
from __future__ import annotations

# A point's identity: rerunning a sweep skips a point whose key is already in runs.csv.
KEY_COLUMNS: tuple[str, ...] = (
    "mixer",  # registry key, also the plot legend
    "preset",  # micro | tiny | small | base
    "overrides",  # JSON of model overrides on top of the preset (e.g. {"depth": 24, "mlp_ratio": 0}), "{}" if none
    "img_size",  # input side in pixels (square)
    "patch_size",  # patch side in pixels
    "batch_size",
    "device",  # cpu | cuda
    "dtype",  # float32 | bfloat16
    "dataset",  # "" when no training ran
    "epochs",  # 0: cost only
    "seed",
    "train",  # JSON of the training recipe fields set by the config ("{}" when epochs is 0 or all defaults)
    "compile",  # torch.compile mode ("default", "max-autotune", ...); "" for eager, as in files older than it
    # how latency was timed: eager (calls issued from Python; on a GPU k back-to-back calls between two CUDA
    # events) | graphed (one CUDA graph replayed); "eager" in files older than it
    "timing_mode",
)

# Key columns added after runs.csv files were written, with the value a row that lacks them means.
OPTIONAL_KEY_COLUMNS: dict[str, str] = {"compile": "", "timing_mode": "eager"}

# `batch_size` 0 in a key: the largest power-of-two batch that fits, found when the point runs ("max" in a config);
# the batches it used are in `batch_used` and `train_batch_used`.
MAX_BATCH = 0

COLUMNS: tuple[str, ...] = KEY_COLUMNS + (
    # what was built
    "tokens",  # N = (img_size / patch_size)^2
    "grid_h",
    "grid_w",
    "dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "impl",  # implementation that actually ran, per mixer: sdpa backend, naive, scan kernel
    "status",  # ok | oom | error | timeout | skipped | diverged
    "error",  # message when status is not ok
    # cost, counted (one image, forward)
    "params",  # trainable parameters
    "macs",  # multiply-accumulates counted by fvcore with handles for SDPA and the scan
    "macs_analytic",  # model.macs(): the sum of every part's formula
    "flops_counted",  # torch.utils.flop_counter.FlopCounterMode total (FLOPs = 2 x MACs)
    "gmacs",  # macs_analytic / 1e9 (the counted macs agree within 1%, tested); filled even for oom rows
    "gflops",  # 2 x gmacs
    # speed, inference (eval, inference_mode), whole batch
    "latency_ms",  # median over repeats
    "latency_iqr_ms",  # interquartile range
    "latency_repeats",
    "latency_calls_per_sample",  # k calls timed back to back per sample (latency = sample / k); empty: 1, synced
    "batch_used",  # the inference batch measured: batch_size, or the one found for batch_size 0 (max)
    "throughput_img_s",  # batch_used / median latency
    "peak_mem_mb",  # peak bytes allocated during one forward, above the baseline (MiB = 2^20 bytes)
    "peak_mem_total_mb",  # peak bytes allocated during one forward, weights and input included (a user's view)
    "peak_mem_reserved_mb",  # CUDA caching allocator's reserved peak; empty on CPU
    # achieved rate: inference FLOPs = 2 x macs_analytic x batch_used; the peak is measured at the sweep's start
    "achieved_tflops",  # inference FLOPs / median latency, in 10^12 FLOP/s
    "device_peak_tflops",  # a dense matmul's rate on this device in this dtype, measured (experiments/measure/peak.py)
    "mfu",  # achieved_tflops / device_peak_tflops, in [0, 1]
    # speed, one training step (forward, backward, optimizer step)
    "train_step_ms",
    "train_step_iqr_ms",
    "train_throughput_img_s",
    "train_peak_mem_mb",
    "train_batch_used",  # the training-step batch measured (batch_size, or the one found for max)
    "train_flops_counted",  # forward + backward FLOPs of one image, FlopCounterMode on the meta device
    "train_achieved_tflops",  # train_flops_counted x train_batch_used / median train step
    "train_mfu",  # train_achieved_tflops / device_peak_tflops
    "train_status",  # ok | oom | skipped (a smaller point's train step ran out of memory) | "" when not measured
    "memory_method",  # how peak memory was read (cuda_allocator | cpu_profiler)
    # cost over a reference mixer's timed beside it, call for call, in alternating blocks at this row's batches
    # (`paired_reference` in the config; experiments/measure/paired.py): a ratio that a machine's drift over the
    # minutes between two rows does not move. Empty where the sweep named no reference, and on its own rows.
    "paired_reference",  # the mixer timed beside this point, at its default options and this point's overrides
    "latency_vs_ref",  # median over rounds of this forward's time over the reference's on either side of it
    "latency_vs_ref_iqr",
    "train_step_vs_ref",  # the same for the training step
    "train_step_vs_ref_iqr",
    # accuracy (when epochs > 0)
    "train_samples",
    "accuracy",  # top-1 on the held-out split after the last epoch, in [0, 1]
    # DIAGNOSTIC ONLY: the highest per-epoch test top-1, i.e. selected on the test split; no table, figure or
    # choice reads it (experiments/lr_grid.py chooses rates on val_accuracy)
    "best_accuracy",
    "lr",  # peak learning rate the point trained at (the recipe's, or the grid's rate)
    "lr_stage",  # "grid": a learning-rate grid run; "seed": a seed run at the rate the grid chose; "" no grid
    "lr_source",  # where a rate named per mixer (lr_by_mixer) or taken from another run (lr_from) was chosen
    "val_samples",  # images held out of the training split (seeded by the point's seed) for validation; 0 = none
    "val_accuracy",  # top-1 on that validation split after the last epoch; what a learning-rate grid chooses on
    "trainer",  # loader (DataLoader, per-image transforms) | device (data and augmentation on the device)
    # JSON {"direction:distance": accuracy in [0, 1]} on tasks whose test images fall into buckets (reach); kept
    # in the row rather than a side file, so runs.csv stays the one file that holds every accuracy
    "accuracy_by_bucket",
    "final_train_loss",
    # the learning curve and the convergence rule (experiments/train; the curve itself in curves/<key hash>.csv)
    # True: stopped by the rule (validation stopped improving); False: ended at the maximum budget under the rule;
    # "": the recipe set no rule (nothing judged it)
    "converged",
    "stop_reason",  # plateau | ceiling | max_budget | diverged | "" (no training, or trained before the rule existed)
    "converged_samples",  # samples seen when the best validation accuracy was first reached (within min_delta)
    "target_accuracy",  # the validation accuracy, in [0, 1], whose first reach the next two columns time
    "samples_to_target",  # samples seen at the first evaluation at or above target_accuracy; empty: never
    "flops_to_target",  # training FLOPs (forward + backward, counted) spent by then; empty: never
    "curve_points",  # evaluations recorded in the point's curve file
    "train_time_s",
    "train_img_s",
    # provenance
    "commit",
    "dirty",  # True when the working tree had uncommitted changes; empty when git could not say (commit unknown)
    "torch_version",
    "triton_version",  # empty where triton is not installed
    "mamba_ssm_version",  # empty where mamba-ssm is not installed
    "cuda_version",
    "device_name",
    "cpu_threads",
    # OMP_WAIT_POLICY the point ran with: PASSIVE where the sweep found other work on the cores, the user's value,
    # or "default" (the OpenMP runtime's own); empty in rows written before the column, which it cannot tell
    "omp_wait_policy",
    "python_version",
    "tf32",  # CUDA float32 matmuls may use TF32 (torch.backends.cuda.matmul.allow_tf32); empty on CPU
    "matmul_precision",  # torch.get_float32_matmul_precision(): highest | high | medium
    "cudnn_benchmark",  # torch.backends.cudnn.benchmark
    "gpu_clock_mhz",  # SM clock nvidia-smi reported when the point ended; empty where it does not answer
    "driver_version",  # NVIDIA driver; empty on CPU
    "load_start",  # 1-minute load average when the sweep started, before it ran anything: other work's load
    # cores other processes kept busy when the sweep started, sampled over 1 s (/proc/stat): unlike the load
    # average, it does not still hold the minute before (a previous stage's or sweep's own trainings)
    "busy_start",
    "load_end",  # 1-minute load average when the point ended (includes the sweep's own threads)
    "point_seconds",  # wall time of the whole point, including counting and training
    # the planner's prediction before the point ran (experiments/sweep/plan.py); empty when uncalibrated
    "predicted_latency_ms",
    "predicted_train_step_ms",
    "predicted_peak_mem_mb",
    "predicted_train_peak_mem_mb",
    "predicted_point_s",
    "timestamp",  # UTC, ISO 8601
)

STATUSES: tuple[str, ...] = ("ok", "oom", "error", "timeout", "skipped", "diverged")

# What the effective receptive field maps in <sweep>/erf/*.npz measure (experiments/train/erf.py writes it, the
# report draws only maps of this method). Files without the field took the sum of the centre token after the
# final LayerNorm, which is identically zero at initialisation: their maps are round-off.
ERF_METHOD = "relu_sum_before_final_norm"

# A training's learning curve: `<sweep>/curves/<key hash>.csv` (the hash as erf/ and checkpoints/ name theirs),
# one row per evaluation, evenly spaced in samples seen. Each row repeats the point's KEY_COLUMNS, so the report
# joins curves to runs.csv by key and a folder of curves reads as one long table.
CURVES_DIR = "curves"
CURVE_COLUMNS: tuple[str, ...] = (
    "eval_index",  # 0, 1, ... in the order evaluated; 0 is before the first optimizer step
    "epoch",  # epochs completed, fractional (samples_seen / training images per epoch)
    "optimizer_steps",
    "samples_seen",  # training images drawn so far (augmented copies count once each)
    "train_flops",  # samples_seen x train_flops_counted of the row (one image's forward + backward FLOPs)
    "wall_s",  # training wall time so far, evaluations excluded, continued across a resume
    "lr",  # the learning rate at this step
    "train_loss",  # mean training loss since the previous evaluation; empty at eval_index 0
    "val_loss",  # on the validation split (fixed, never augmented)
    "val_accuracy",  # top-1 in [0, 1] on the validation split
    "val_accuracy_by_bucket",  # JSON {"direction:distance": accuracy} where the task has buckets (reach), else ""
)
