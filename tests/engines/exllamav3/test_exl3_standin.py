"""The CPU stand-in for the CUDA extension (test infrastructure) on the real stock wheel."""

from __future__ import annotations

from exl3_probes import probe

from overlay.check.envs import Arms


def test_standin_imports_stock_wheel(arms: Arms) -> None:
    info = arms.stock.run_json(probe("standin_info.py"), {})
    assert info["imported"] and info["standin"]
    # ext.py took its own "precompiled extension" branch and got the stand-in
    assert info["origin"].endswith(".overlay-standin.so")
    # names come from the bindings the wheel ships: hasattr answers as the real module does
    assert info["functions"] >= 150
    assert info["has"] == {
        "rms_norm": True,
        "sparse_head_argmax": True,
        "BC_Attention": True,
        "no_such_kernel": False,
    }
    assert info["attrs"] == {"HAS_DFLASH2": True, "HAS_DET_GEMM": True, "FUSED_SAMPLER_MAX_BLOCKS": 128}
    # a kernel call is recorded and refused with a message naming it
    assert "exllamav3_ext.rms_norm is a CUDA kernel" in info["call"]
    assert info["calls"] == {"rms_norm": 1}


def test_standin_switch_off_restores_stock_failure(arms: Arms) -> None:
    info = arms.stock.run_json(probe("standin_info.py"), {}, extra_env={"OVERLAY_EXL3_STANDIN": "0"})
    # without the stand-in, CPU torch cannot JIT-build the extension: the stock import error comes back
    assert not info["imported"]
    assert "CUDA_HOME" in info["error"]
