"""mlx in another interpreter: the environment its subprocesses get, finding an interpreter that has mlx and
mlx-lm, and running ``_mlx_tasks.py`` there with one JSON request (training, measuring)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from overlay.errors import ExternalCommandError, UsageError
from overlay.progress import Reporter

OPENBLAS: Final = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
MLX_TASKS: Final = Path(__file__).with_name("_mlx_tasks.py")
TRAIN_TIMEOUT_S: Final = 3600

MLX_HINT: Final = (
    "pass python=PATH (CLI: --python PATH) naming an interpreter with mlx and mlx-lm, e.g. a venv made with "
    "`pip install 'mlx[cpu]==0.32.4' mlx-lm==0.32.2 numpy safetensors tokenizers`, or use the stock mlx-lm arm that "
    "overlay.check.envs builds (CLI: --python stock; Python: overlay.check.models.stock_mlx_python(root))"
)


def mlx_tmpdir() -> Path:
    """TMPDIR of mlx subprocesses (``$OVERLAY_MLX_TMPDIR``, default ``<system temp>/overlay-mlx-<uid>``).

    mlx keeps its JIT-compiled CPU kernels in ``$TMPDIR/mlx/<version>/``; a private folder survives other processes
    that clean ``/tmp/mlx`` while we compile (seen: ``ld: cannot open output file /tmp/mlx/...``), and is shared by
    every build root so the one-time compile (~15-25 s per training graph) is paid once per machine.
    """
    configured = os.environ.get("OVERLAY_MLX_TMPDIR")
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / f"overlay-mlx-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def mlx_env() -> dict[str, str]:
    """Environment of mlx subprocesses: Debian OpenBLAS preloaded when present (fp32 GEMM ~20x faster than mlx's
    bundled reference BLAS), offline Hugging Face, and a private TMPDIR (:func:`mlx_tmpdir`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONNOUSERSITE": "1",
            "TMPDIR": str(mlx_tmpdir()),
        }
    )
    if OPENBLAS.exists() and str(OPENBLAS) not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(p for p in (str(OPENBLAS), env.get("LD_PRELOAD", "")) if p)
    return env


_PROBED: dict[str, dict[str, str]] = {}


def probe_mlx_python(python: Path) -> dict[str, str]:
    """Versions of mlx and mlx_lm in ``python``; UsageError (with how to get one) if it cannot import them."""
    if str(python) in _PROBED:
        return _PROBED[str(python)]
    code = (
        "import json, importlib.metadata as m, mlx.core, mlx_lm; "
        "print(json.dumps({'mlx': m.version('mlx'), 'mlx_lm': m.version('mlx-lm')}))"
    )
    try:
        proc = subprocess.run(
            [str(python), "-c", code], check=False, capture_output=True, text=True, env=mlx_env(), timeout=300
        )
    except OSError as exc:
        raise UsageError(f"cannot run the interpreter {python}: {exc}", tip=MLX_HINT) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise UsageError(f"the interpreter {python} cannot import mlx and mlx_lm ({last})", tip=MLX_HINT)
    versions: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    _PROBED[str(python)] = versions
    return versions


def resolve_mlx_python(kind: str, python: Path | None) -> Path:
    """The interpreter that trains ``kind``: ``python`` if given, else this one if it has mlx, else an error."""
    if python is not None:
        return Path(python)
    if importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None:
        return Path(sys.executable)
    raise UsageError(
        f"building {kind!r} trains a model with mlx, and this interpreter ({sys.executable}) cannot import "
        "mlx and mlx_lm",
        tip=MLX_HINT,
    )


def stock_mlx_python(root: Path, reporter: Reporter | None = None) -> Path:
    """The interpreter of the stock mlx-lm arm (pinned mlx-lm wheel over the mlx-lm deps venv), built on demand."""
    from overlay.check.envs import arm_env
    from overlay.core.fetch import fetch_artifact
    from overlay.core.manifest import load_engine

    manifest = load_engine(root, "mlx-lm")
    wheel = fetch_artifact(root, manifest, manifest.upstream.primary, reporter=reporter)
    return arm_env(root, manifest, wheel, name="stock", reporter=reporter).python


def run_mlx_script(python: Path, payload: dict[str, Any], what: str) -> dict[str, Any]:
    """Run ``_mlx_tasks.py`` in ``python`` with ``payload``; the JSON result, or ExternalCommandError."""
    proc = subprocess.run(
        [str(python), str(MLX_TASKS)],
        check=False,
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=mlx_env(),
        timeout=TRAIN_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"{what} failed in {python} (exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}",
            tip="rerun with the same interpreter to see the full log; the scratch model directory was removed",
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise ExternalCommandError(f"{what} printed no JSON result: {proc.stdout[-1000:]!r}") from None
    return result
