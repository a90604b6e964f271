"""ExLlamaV3 adapter: the engine needs CUDA for its extension. On a GPU machine it would run the tasks through the
device scripts; on CPU, `check` runs the patch-level differential tests (stock vs patched on the same inputs, with the
labelled stand-in extension) and says so in the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from overlay.check.adapter import Models
from overlay.check.envs import Arm
from overlay.core.inputs import inside_root
from overlay.core.manifest import load_engine
from overlay.engines import WORKERS
from overlay.errors import UsageError
from overlay.progress import Reporter
from overlay.schemas.documents import WorkerRequest

# workers/exllamav3_census.py; prefill-chunk: workers/exllamav3_census_prefill.py; drafter-load:
# workers/exllamav3_census_load.py; verify-mlp: workers/exllamav3_census_mlp.py
CENSUS_SCENARIOS = (
    "decode-step",
    "spec-verify-step",
    "draft-round",
    "prefill-chunk",
    "drafter-load",
    "verify-mlp",
)


class ExLlamaV3Adapter:
    engine = "exllamav3"

    def unavailable(self, arm: Arm) -> str | None:
        proc = arm.run(
            ["-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"], timeout=300
        )
        if proc.returncode == 0:
            return None
        return "ExLlamaV3 needs a CUDA device for its extension; none is visible here"

    def tasks(self) -> tuple[str, ...]:
        return ()

    def models(
        self,
        *,
        root: Path,
        arm: Arm,
        model: Path | None,
        draft: Path | None,
        reporter: Reporter,
        target_kind: str | None = None,
        draft_kind: str | None = None,
    ) -> Models:
        raise UsageError(
            "exllamav3 models are EXL3 checkpoints built on a GPU machine (scripts/device/exllamav3_check.*)"
        )

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        if (
            request.get("task") == "census"
        ):  # CPU: the real generator round code, labelled stand-ins around it
            result: dict[str, Any] = arm.run_json(
                WORKERS / "exllamav3_census.py", request, timeout=timeout or 900
            )
            return result
        raise UsageError("exllamav3 tasks run on a GPU machine: see scripts/device/")

    def census_scenarios(self) -> tuple[str, ...]:
        return CENSUS_SCENARIOS

    def census_variants(
        self, *, root: Path, arm: Arm, models: Models | None, explicit: bool, reporter: Reporter
    ) -> tuple[Any, ...]:
        """Two block drafters (workers/exllamav3_census.py "drafter_layers"): every layer a window ring (what
        --draft_window makes of a DFlash drafter; its state side is the wheel's SlidingAttention code) and paged
        layers; decode-step does not involve the drafter and runs once, prefill-chunk (the drafter's prefill K/V
        update, whose paged write is an extension kernel) with the ring drafter only. In drafter-load (model_init's
        caches) the same two are the drafter checkpoint's layer types: "sliding_attention" (window rings) and
        "full_attention" (paged)."""
        from overlay.check.census import Variant

        spec = ("spec-verify-step", "draft-round", "drafter-load")
        return (
            Variant(name="ring drafter", model="", extra=(("drafter_layers", "ring"),)),
            Variant(name="paged drafter", model="", extra=(("drafter_layers", "paged"),), scenarios=spec),
            # an MTP drafter's round (GLM-5.2's DSA MLA head attention; workers/exllamav3_census_mtp.py)
            Variant(name="mtp drafter", model="", extra=(("drafter", "mtp"),), scenarios=("draft-round",)),
        )

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        return run_patch_tests(root, "exllamav3", reporter)


def run_patch_tests(root: Path, engine: str, reporter: Reporter) -> dict[str, Any]:
    """Run the manifest's ``check.tests`` (the per-patch stock-vs-patched tests) and summarise the outcome."""
    manifest = load_engine(root, engine)
    if not manifest.check.tests:
        return {"ran": False, "reason": f"{manifest.path.name} declares no check.tests"}
    paths = [
        inside_root(root, root / t, what=f"{manifest.path.name}: check.tests entry")
        for t in manifest.check.tests
    ]
    missing = [str(p.relative_to(root)) for p in paths if not p.exists()]
    if missing:
        return {"ran": False, "reason": f"check.tests names what does not exist: {', '.join(missing)}"}
    shown = " ".join(manifest.check.tests)
    reporter.step("check", f"{engine}: running the patch-level differential tests in {shown}")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, paths)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return {
        "ran": True,
        "command": f"pytest -q {shown}",
        "exit_code": proc.returncode,
        "summary": tail,
        "passed": proc.returncode == 0,
    }
