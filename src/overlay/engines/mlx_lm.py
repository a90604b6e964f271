"""mlx-lm adapter: runs for real on this machine (mlx[cpu]); tasks go to workers/mlx_lm_worker.py in each arm."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from overlay.check.adapter import Models, given_models
from overlay.check.census import Variant
from overlay.check.envs import Arm
from overlay.engines import WORKERS
from overlay.errors import ExternalCommandError, UsageError
from overlay.paths import layout
from overlay.progress import Reporter
from overlay.schemas.documents import WorkerRequest

DEFAULT_TARGET = "llama-target"
# A tiny DeepSeek-V3.2 (MLA, MoE, the DSA indexer) for the census: the bundled tiny models have no DSA family. With
# index_topk 4 the indexer selects among the keys from 5 on, and MLX_LM_INDEXER_PRESELECT's block preselection (patch
# 0008) takes over from 4 * 8 * index_topk = 128 keys; its census variant decodes after a 160-token prompt.
DSA_CENSUS_CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v32",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "n_group": 2,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    "qk_nope_head_dim": 8,
    "index_head_dim": 16,
    "index_n_heads": 2,
    "index_topk": 4,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "tie_word_embeddings": False,
}
DSA_CENSUS_PROMPT = 160
DEFAULT_DRAFT = "llama-draft"
CENSUS_SCENARIOS = ("decode-token", "spec-verify-step", "draft-round", "prefill-chunk")


class MlxLmAdapter:
    engine = "mlx-lm"
    worker = WORKERS / "mlx_lm_worker.py"

    def unavailable(self, arm: Arm) -> str | None:
        proc = arm.run(["-c", "import mlx.core as mx; mx.array([1]) + 1"], timeout=120)
        if proc.returncode != 0:
            return f"mlx does not import in the arm: {proc.stderr.strip()[-300:]}"
        return None

    def tasks(self) -> tuple[str, ...]:
        return ("greedy", "logits", "spec", "speed", "cold")

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

        if (given := given_models(model, draft)) is not None:
            return given
        tk = target_kind or DEFAULT_TARGET
        dk = draft_kind or DEFAULT_DRAFT
        reporter.step("model", f"bundled tiny models: target {tk}, draft {dk}")
        target = tinymodels.build(tk, root=root, python=arm.python)
        real_draft = draft or tinymodels.build(dk, root=root, python=arm.python)
        return Models(target=target, target_kind=tk, draft=real_draft, draft_kind=None if draft else dk)

    def run(self, arm: Arm, request: WorkerRequest, *, timeout: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = arm.run_json(self.worker, request, timeout=timeout or 1800)
        return result

    def option_reach(self, arm: Arm, options: dict[str, str | None]) -> set[str]:
        """The CLI options some comparison task (greedy, spec, speed, sample) applies in ``arm``: the worker's
        ``options`` task matches each against the parameters of the mlx-lm functions those tasks call."""
        try:
            res = arm.run_json(self.worker, {"task": "options", "options": options}, timeout=300)
        except ExternalCommandError:
            return set()
        return {name for name, tasks in res["reach"].items() if tasks}

    def fallback(self, *, root: Path, reporter: Reporter) -> dict[str, Any]:
        raise UsageError("mlx-lm has no fallback: it runs here")

    def census_scenarios(self) -> tuple[str, ...]:
        return CENSUS_SCENARIOS

    def census_variants(
        self, *, root: Path, arm: Arm, models: Models | None, explicit: bool, reporter: Reporter
    ) -> tuple[Variant, ...]:
        """The census runs each scenario on a dense and a hybrid model (a patch may act on one family only) and, for
        the sampler patches, with a top-k sampler. Speculative scenarios run with the target as its own drafter (every
        draft accepted) and with a never-right drafter (every round rejects and rolls back); decode-token also on a
        4-bit copy of the dense model (quantized weights: fused projections, memory) and on a tiny random DeepSeek-V3.2
        after a prompt long enough for its sparse-attention indexer to select (DSA_CENSUS_CONFIG). With --model, that
        model alone (its own drafter, and a never-right copy)."""
        from overlay.check import models as tinymodels
        from overlay.check.inputs import never_right_draft

        spec = ("spec-verify-step", "draft-round")

        def never(target: Path) -> str:
            out = layout(root).models / f"census-never-right-{target.name}"
            if not (out / "config.json").is_file():
                never_right_draft(target, out)
            return str(out)

        if explicit and models is not None:
            name = models.target.name
            return (
                Variant(name=name, model=str(models.target)),
                Variant(
                    name=f"{name}, never-right drafter",
                    model=str(models.target),
                    extra=(("draft", never(models.target)),),
                    scenarios=spec,
                ),
            )

        def quantized(src: Path) -> str:  # mlx-lm's own convert (4-bit, group 32), in the stock arm
            out = layout(root).models / f"census-q4g32-{src.name}"
            if not (out / "config.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                proc = arm.run(
                    [
                        "-m",
                        "mlx_lm",
                        "convert",
                        "--hf-path",
                        str(src),
                        "--mlx-path",
                        str(out),
                        "-q",
                        "--q-bits",
                        "4",
                        "--q-group-size",
                        "32",
                    ],
                    timeout=600,
                )
                if proc.returncode != 0:
                    raise ExternalCommandError(
                        f"mlx_lm convert -q of {src} failed: {proc.stderr.strip()[-300:]}",
                        tip="rerun with --debug; the census needs the arm's mlx_lm to quantize",
                    )
            return str(out)

        def random_model(name: str, config: dict[str, Any], tokenizer_from: Path) -> str:
            """A tiny random model of a family the bundled ones lack (mlx-lm's own initialisation, seed 0)."""
            out = layout(root).models / name
            if not (out / "config.json").is_file():
                reporter.step("model", f"census model {name} ({config['model_type']}, random weights)")
                vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
                arm.run_json(
                    WORKERS / "mlx_random_model.py",
                    {
                        "config": {**config, "vocab_size": vocab},
                        "out": str(out),
                        "tokenizer_from": str(tokenizer_from),
                        "seed": 0,
                    },
                    timeout=600,
                )
            return str(out)

        llama_dir = tinymodels.build("llama-random", root=root, python=arm.python, reporter=reporter)
        llama = str(llama_dir)
        dsa = random_model("census-dsa-random", DSA_CENSUS_CONFIG, llama_dir)
        hybrid = str(tinymodels.build("qwen3_5-random", root=root, python=arm.python, reporter=reporter))
        return (
            Variant(name="llama", model=llama),
            Variant(
                name="llama, never-right drafter",
                model=llama,
                extra=(("draft", never(llama_dir)),),
                scenarios=spec,
            ),
            Variant(
                name="qwen3_5 (hybrid), llama drafter", model=hybrid, extra=(("draft", never(llama_dir)),)
            ),
            Variant(
                name="llama, temp 0.7 top-k 20", model=llama, extra=(("sampler", {"temp": 0.7, "top_k": 20}),)
            ),
            Variant(name="llama 4-bit", model=quantized(llama_dir), scenarios=("decode-token",)),
            Variant(
                name=f"deepseek_v32 (DSA), {DSA_CENSUS_PROMPT}-token prompt",
                model=dsa,
                extra=(("prompt_tokens", DSA_CENSUS_PROMPT),),
                scenarios=("decode-token",),
            ),
        )

    def census_label(self, metric: str, stock: dict[str, Any], patched: dict[str, Any]) -> str | None:
        """Which part of a counted change a Metal build would also see (the census runs on mlx's CPU backend)."""
        if metric in ("evals-per-token", "host-syncs"):
            return "backend-independent: the same evals and host reads run on Metal"
        if metric != "ops-per-token":
            return None
        raw = [(r.get("metrics") or {}).get(metric) for r in (stock, patched)]
        raw += [(r.get("detail") or {}).get("metal-ops-per-token") for r in (stock, patched)]
        nums = [float(v) for v in raw if isinstance(v, (int, float))]
        if len(nums) != 4:
            return None
        cs, cp, ms, mp = nums
        est = f"Metal estimate {ms:.4g} -> {mp:.4g}"
        traced = [(r.get("detail") or {}).get("compiled-fast-calls-per-token") or 0 for r in (stock, patched)]
        if traced[0] != traced[1]:
            # Inside a compiled function the fast calls' CPU fallbacks cannot be told apart from the rest, so they
            # are counted as primitives and the call added back once: an add + RMSNorm compiled is 2 Metal kernels,
            # estimated 5 (docs/engines/mlx-lm.md, "Mechanism census").
            est += ", over-counted: compiled functions with fast calls inside"
        if cp < cs and not mp < ms:
            return (
                f"CPU-only: the decrease comes from mx.fast CPU fallbacks a Metal build runs as one kernel each "
                f"({est})"
            )
        if cp > cs and not mp > ms:
            return f"CPU-only increase ({est})"
        return f"Metal would also see it ({est})"
