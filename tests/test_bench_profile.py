"""experiments.bench.profile: where a mixer's time goes, by kernel or operator name and class."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.bench.profile import kernel_class, main

from messages import one_line_error


@pytest.mark.parametrize("name,expected", [
    ("void selective_scan_fwd_kernel<Selective_Scan_fwd_kernel_traits<32, 4, true, true, true, c10::BFloat16>>", "scan"),
    ("_scan_bwd_kernel", "scan"),
    ("mixerbench::gla_recurrent_cpp_bwd", "scan"),
    ("GeneratedBackwardFor_mixerbench_ssd_hydra_cpp_defaultBackward", "scan"),
    ("mixerbench::ssd_recurrent_cpp", "scan"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_NNT", "matmul"),
    ("aten::addmm", "matmul"),
    ("void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
     "copy/layout"),
    ("aten::flip", "copy/layout"),
    ("Memset (Device)", "copy/layout"),
    ("void causal_conv1d_fwd_kernel<128>", "conv"),
    ("aten::convolution_backward", "conv"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>", "reduction"),
    ("aten::mul", "elementwise/other"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3>>",
     "elementwise/other"),
    ("aten::convert_element_type", "elementwise/other"),
    ("aten::_to_copy", "copy/layout"),
    ("aten::roll", "copy/layout"),
    ("aten::constant_pad_nd", "copy/layout"),
    ("aten::conv1d", "conv"),
    ("triton_poi_fused_mul_silu_0", "elementwise/other"),
])
def test_kernel_names_fall_in_their_class(name: str, expected: str) -> None:
    assert kernel_class(name) == expected


def test_every_triton_scan_kernel_is_classed_as_the_scan() -> None:
    """A profile finds the scan by its kernels' names: renaming one must not move it out of the scan's share."""
    pytest.importorskip("triton")
    from mixers.ops.selective_scan import triton_scan

    kernels = [name for name in vars(triton_scan) if name.endswith("_kernel")]
    assert len(kernels) >= 3 and {kernel_class(name) for name in kernels} == {"scan"}


def test_profile_writes_shares_that_add_up_with_provenance(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "profile.csv"
    main(["--mixers", "mamba", "linear", "--tokens", "16", "64", "--dim", "16", "--heads", "2", "--repeats", "1",
          "--top", "3", "--csv", str(path)])
    rows = pd.read_csv(path, keep_default_na=False)
    assert {"commit", "dirty", "torch_version", "device_name", "repeats", "mixer", "impl", "tokens", "name", "class",
            "ms_per_iter", "calls_per_iter", "share"} <= set(rows.columns)
    assert set(zip(rows["mixer"], rows["tokens"])) == {(m, n) for m in ("mamba", "linear") for n in (16, 64)}
    for _, case in rows.groupby(["mixer", "tokens"]):
        assert case["share"].sum() == pytest.approx(1.0)
        assert (case["ms_per_iter"] > 0).all() and case["name"].is_unique
    out = capsys.readouterr().out
    assert out.count("| kernel / operator |") == 4 and "forward+backward" in out and "commit " in out


@pytest.mark.parametrize("argv,message", [
    (["--tokens", "100", "--mixers", "mambaa"], "unknown mixer(s) mambaa; registered:"),
    (["--tokens", "50"], "50 tokens is not a square grid"),
    (["--tokens", "0"], "argument --tokens: must be in 1 .."),
    (["--options", "d_state"], "--options: expected key=value, got 'd_state'"),
    (["--options", "no_such_option=1", "--tokens", "16"], "mamba with --dim 192 --heads 3 --options"),
    # issue 35: each was a traceback (or a 768 GiB allocation), or failed after profiling
    (["--mixers", "vmamba", "--options", "expand=-1", "--tokens", "16"], "expand"),
    (["--mixers", "gla", "--options", "chunk_size=True", "--tokens", "16"], "chunk_size"),
    (["--tokens", "1073741824"], "argument --tokens: must be in 1 .."),
    (["--mixers", "neighborhood", "--options", "impl=flex", "--tokens", "16", "--dim", "16", "--heads", "2"],
     "cannot run forward+backward on cpu"),
    (["--options", "scan_impl=triton", "--tokens", "16", "--dim", "16", "--heads", "2"], "cannot run"),
    (["--csv", "/", "--tokens", "16"], "is not a regular file"),
])
def test_bad_arguments_are_one_line(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    one_line_error(capsys, message)


def test_cuda_without_a_device_is_one_line(capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cuda"])
    assert exit_.value.code == 2
    one_line_error(capsys, "--device cuda: no CUDA device here; use --device cpu")
