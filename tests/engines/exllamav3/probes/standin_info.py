"""Probe: import exllamav3 through the CPU extension stand-in and describe what it provides."""

from __future__ import annotations

from _common import emit, read_payload


def main() -> None:
    read_payload()
    try:
        import exllamav3  # noqa: F401
    except Exception as e:
        emit({"imported": False, "error": f"{type(e).__name__}: {e}"[:300]})
        return
    import torch
    from exllamav3.ext import exllamav3_ext as ext

    functions = [
        n for n in dir(ext) if callable(getattr(ext, n)) and not n[0].isupper() and not n.startswith("_")
    ]
    try:
        ext.rms_norm(torch.zeros(1), torch.zeros(1), torch.zeros(1), 1e-6, 0.0, 1.0, False, False)
        called = "returned"
    except ext.StandInError as e:
        called = str(e)
    emit(
        {
            "imported": True,
            "origin": ext.__spec__.origin,
            "standin": bool(getattr(ext, "OVERLAY_STANDIN", False)),
            "functions": len(functions),
            "has": {
                n: hasattr(ext, n)
                for n in ("rms_norm", "sparse_head_argmax", "BC_Attention", "no_such_kernel")
            },
            "attrs": {
                n: getattr(ext, n) for n in ("HAS_DFLASH2", "HAS_DET_GEMM", "FUSED_SAMPLER_MAX_BLOCKS")
            },
            "call": called,
            "calls": dict(ext.calls),
        }
    )


if __name__ == "__main__":
    main()
