"""The words of the ``Overlay-Flag`` and ``Overlay-Mechanism`` trailers (DESIGN.md, "Trailers for flags, mechanisms
and dependencies"), as data, and their parsers. Pure: no I/O, no imports of engine code.

API (what the census and lint use; keep it this small):

- ``METRICS``, ``DIRECTIONS``, ``MECHANISM_THEMES``: tuples of the valid words.
- ``SCENARIOS``: ``{engine: {scenario: one line of meaning}}``, the scenarios each engine's census defines;
  ``scenarios(engine)`` gives that engine's names (empty for an engine with no census).
- ``Mechanism(metric, direction, scenario)``: one ``Overlay-Mechanism: METRIC DIRECTION in SCENARIO`` line;
  ``parse_mechanism(text, engine=None)`` parses one (the scenario checked against ``engine``'s census when given).
- ``requires_problems(order)``: for ``(patch name, its Overlay-Requires names)`` in series order, what is wrong
  (a required patch missing, or not before the patch); names match ignoring the ``NNNN-`` number, which refresh
  and rebase rewrite. Lint reports these as errors, refresh and rebase as warnings.
- ``Flag(kind, name, value)``: one ``Overlay-Flag`` value: ``env`` (``NAME=VALUE``), ``cli`` (``--option`` or
  ``--option=VALUE``) or ``default`` (always on); ``parse_flag(text)`` parses one, ``Flag.text`` writes it back
  and ``Flag.environ`` is the environment a census run sets for it.

Both parsers raise ``ConfigError`` naming the offending text and the closest valid word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from overlay.core.inputs import closest
from overlay.errors import ConfigError

METRICS: tuple[str, ...] = (
    "host-syncs",  # device->host reads and host-blocking waits
    "h2d-copies",
    "pageable-copies",
    "eager-launches",  # ops dispatched outside captured regions
    "graph-launches",  # ops inside captured regions
    "collectives",
    "bytes-moved",
    "peak-memory",
    "capturable",  # the region runs under a mode that raises on any host read or dynamic shape
    "ops-per-token",  # mlx primitives evaluated per generated token
    "evals-per-token",
    "cache-hits",
    # modules imported from scratch across the engine's processes from launch to the first token (the sum over
    # processes of the modules each imported itself, not inherited through fork)
    "module-imports",
    # elements passed through full sorts (aten.sort) in device work: a sort costs n log n, the vocabulary-wide sort of
    # a top-p sampler is the case
    "sort-elements",
    # device bytes allocated by a step's ops, summed (freed or not): its temporaries, which peak-memory sees only when
    # one of them sets the step's peak
    "alloc-bytes",
    # random numbers drawn through torch's generators by a step's device ops (the elements the random-sampling ops
    # write): a sampler that draws noise over the whole vocabulary for a token it could draw from a few candidates
    "random-elements",
    # bytes of the operands the step's matrix-multiply ops read (aten mm, addmm, bmm, _scaled_mm, ...: weights,
    # activations, bias, scales): at decode batch sizes a GEMM is bound by reading its weight, so a narrower weight
    # (an FP8 copy of a BF16 head) reads fewer of them
    "gemm-bytes",
)
DIRECTIONS: tuple[str, ...] = ("decreases", "increases", "unchanged", "becomes-true")
# `capturable` is a property, not a count: it only becomes true or stays as it was
BOOLEAN_METRICS: tuple[str, ...] = ("capturable",)
BOOLEAN_DIRECTIONS: tuple[str, ...] = ("becomes-true", "unchanged")

_TORCH_SCENARIOS: dict[str, str] = {
    "decode-step": "one batched decode forward without speculation: schedule, forward, sample, one token per request",
    "spec-verify-step": "one speculative verify step: score the draft tokens with the target, accept, commit",
    "draft-round": "one drafter round: propose the draft tokens for the next verify step",
    "draft-extend": "the drafter catching up on the accepted tokens after a verify (its KV and hidden state)",
    "prefill-chunk": "one chunk of prompt prefill through the target model",
}
SCENARIOS: dict[str, dict[str, str]] = {
    "sglang": {
        **_TORCH_SCENARIOS,
        "decode-step-sampled": "decode-step with sampled requests (temperature 0.7, top-k and top-p) on the pytorch "
        "sampling backend: the sampler's filtered path",
        "decode-step-spec": "decode-step of a speculative engine (STANDALONE, k = 1): the scheduler's whole step of a "
        "decode batch, draft round, verify, draft-extend and result processing (the acceptance bookkeeping)",
        "draft-extend-draft": "a draft-extend and the next draft round as one step inside one capture region: what "
        "one combined CUDA graph would hold (capturable measured, each violation with its site and zone)",
    },
    "exllamav3": {
        **_TORCH_SCENARIOS,
        "prefill-chunk": "one chunk of prompt prefill as the drafter sees it: the DFlash drafter's K/V update from the "
        "target's tapped hidden states (dflash_update_kv_from_target: fc, norm, k/v projections, window writes)",
        "drafter-load": "model_init building and allocating the drafter's caches (paged layers, window rings) for the "
        "cache size asked: the device memory they take",
        "verify-mlp": "the target's MLP over one verify forward's rows (bsz 2 x (K 7 + 1) = 16): GatedMLP.forward's "
        "choice between the bound class's graphed multi-token path and the eager per-linear kernels",
    },
    "mlx-lm": {
        "decode-token": "one generated token of plain (non-speculative) generation: forward, sample, eval",
        "spec-verify-step": "one speculative verify: the target scores the drafted tokens, accepts, rewinds caches",
        "draft-round": "one drafter round: the draft model (or MTP head) proposes the next tokens",
        "prefill-chunk": "one chunk of prompt prefill through the model (prefill_step_size tokens)",
    },
    "vllm": {
        "decode-step": "one batched decode engine step without speculation: schedule, forward, sample, outputs",
        "decode-step-sampled": "decode-step with seeded sampled requests (temperature, top-k and top-p)",
        "decode-step-top-p": "decode-step with seeded sampled requests (temperature and top-p, no top-k)",
        "decode-step-penalties": "decode-step with seeded sampled requests (temperature, repetition, presence and "
        "frequency penalties)",
        "prefill-chunk": "one engine step prefilling one chunk of a prompt (chunked prefill, max_num_batched_tokens)",
        "spec-verify-step": "one n-gram speculative engine step: verify the drafts, reject-sample, propose the next",
        "spec-verify-step-sampled": "spec-verify-step with seeded sampled requests (temperature, top-k and top-p): "
        "the rejection sampler's random path",
        "cold-start": "engine launch to the first token in vLLM's default process layout",
    },
}

# Overlay-Theme values whose patches must declare at least one Overlay-Mechanism
MECHANISM_THEMES: tuple[str, ...] = (
    "h2d-sync",
    "cuda-graph",
    "dispatch-fusion",
    "sampling-fusion",
    "allreduce-fusion",
    "kernel-injection",
    "lm-head",
    "drafter-kv",
)

FlagKind = Literal["env", "cli", "default"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLI_NAME = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*$")
_NUMBERED = re.compile(r"^\d{4}-")


def scenarios(engine: str) -> tuple[str, ...]:
    """The scenario names ``engine``'s census defines (empty when it defines none)."""
    return tuple(SCENARIOS.get(engine, {}))


@dataclass(frozen=True)
class Mechanism:
    metric: str
    direction: str
    scenario: str

    @property
    def text(self) -> str:
        return f"{self.metric} {self.direction} in {self.scenario}"


@dataclass(frozen=True)
class Flag:
    kind: FlagKind
    name: str  # env var name, or the CLI option with its dashes; "default" for an always-on patch
    value: str | None  # env: the value; cli: the option's value, if any; default: None

    @property
    def text(self) -> str:
        if self.kind == "default":
            return "default"
        if self.kind == "env":
            return f"{self.name}={self.value}"
        return self.name if self.value is None else f"{self.name}={self.value}"

    @property
    def environ(self) -> dict[str, str]:
        """The environment variables that turn the patch on (empty for a CLI option or a default patch)."""
        return {self.name: self.value or ""} if self.kind == "env" else {}


def parse_mechanism(text: str, *, engine: str | None = None) -> Mechanism:
    """``METRIC DIRECTION in SCENARIO``; with ``engine``, SCENARIO must be one its census defines."""
    words = text.split()
    if len(words) != 4 or words[2] != "in":
        raise ConfigError(
            f"Overlay-Mechanism {text!r} is not `METRIC DIRECTION in SCENARIO`",
            tip="e.g. `Overlay-Mechanism: host-syncs decreases in spec-verify-step`; see docs/dev/patch-authoring.md",
        )
    metric, direction, _in, scenario = words
    if metric not in METRICS:
        raise ConfigError(
            f"Overlay-Mechanism {text!r}: unknown metric {metric!r}{closest(metric, list(METRICS))}",
            tip=f"metrics: {', '.join(METRICS)}",
        )
    if direction not in DIRECTIONS:
        raise ConfigError(
            f"Overlay-Mechanism {text!r}: unknown direction {direction!r}{closest(direction, list(DIRECTIONS))}",
            tip=f"directions: {', '.join(DIRECTIONS)}",
        )
    if metric in BOOLEAN_METRICS and direction not in BOOLEAN_DIRECTIONS:
        raise ConfigError(
            f"Overlay-Mechanism {text!r}: {metric} is a property, it can only be "
            f"{' or '.join(BOOLEAN_DIRECTIONS)}, not {direction!r}",
            tip=f"write `{metric} becomes-true in {scenario}`",
        )
    if direction == "becomes-true" and metric not in BOOLEAN_METRICS:
        raise ConfigError(
            f"Overlay-Mechanism {text!r}: becomes-true applies to {', '.join(BOOLEAN_METRICS)} only, not {metric!r}",
            tip="a count decreases, increases or stays unchanged",
        )
    if engine is not None:
        known = scenarios(engine)
        if not known:
            raise ConfigError(
                f"Overlay-Mechanism {text!r}: engine {engine!r} defines no census scenarios",
                tip=f"engines with a census: {', '.join(SCENARIOS)}",
            )
        if scenario not in known:
            raise ConfigError(
                f"Overlay-Mechanism {text!r}: {engine} has no scenario {scenario!r}{closest(scenario, list(known))}",
                tip=f"{engine} scenarios: {', '.join(known)}",
            )
    elif not any(scenario in s for s in SCENARIOS.values()):
        every = sorted({s for d in SCENARIOS.values() for s in d})
        raise ConfigError(
            f"Overlay-Mechanism {text!r}: unknown scenario {scenario!r}{closest(scenario, every)}",
            tip=f"scenarios: {', '.join(every)}",
        )
    return Mechanism(metric=metric, direction=direction, scenario=scenario)


def parse_flag(text: str) -> Flag:
    """``default``, ``ENV=VALUE`` or ``--cli-option[=VALUE]``."""
    value = text.strip()
    if not value or len(value.split()) != 1:
        raise ConfigError(
            f"Overlay-Flag {text!r} must be one word: ENV=VALUE, --cli-option, or default",
            tip="e.g. `Overlay-Flag: SGLANG_OPT_CHAIN_TREE=1`; see docs/dev/patch-authoring.md",
        )
    if value == "default":
        return Flag(kind="default", name="default", value=None)
    if value.startswith("-"):
        name, eq, opt = value.partition("=")
        if not _CLI_NAME.match(name):
            raise ConfigError(f"Overlay-Flag {text!r}: {name!r} is not a long CLI option (`--some-option`)")
        if eq and not opt:
            raise ConfigError(f"Overlay-Flag {text!r}: the option has `=` but no value")
        return Flag(kind="cli", name=name, value=opt if eq else None)
    name, eq, env_value = value.partition("=")
    if not eq:
        raise ConfigError(
            f"Overlay-Flag {text!r} is neither ENV=VALUE, a --cli-option nor default{closest(value, ['default'])}",
            tip=f"an environment variable needs its value: `{value}=1`",
        )
    if not _ENV_NAME.match(name):
        raise ConfigError(f"Overlay-Flag {text!r}: {name!r} is not an environment variable name")
    if not env_value:
        raise ConfigError(
            f"Overlay-Flag {text!r}: {name} has no value", tip=f"write the value that turns it on: `{name}=1`"
        )
    return Flag(kind="env", name=name, value=env_value)


def patch_slug(name: str) -> str:
    """A patch file name without its ``NNNN-`` number (what survives a renumbering)."""
    return name[5:] if _NUMBERED.match(name) else name


def requires_problems(order: Sequence[tuple[str, Sequence[str]]]) -> list[tuple[str, str]]:
    """``(patch, message)`` for every Overlay-Requires of ``order`` that is not an earlier patch of it."""
    position = {patch_slug(name): i for i, (name, _req) in enumerate(order)}
    problems: list[tuple[str, str]] = []
    for i, (name, required) in enumerate(order):
        for req in required:
            j = position.get(patch_slug(req))
            if j is None:
                problems.append((name, f"Overlay-Requires {req!r}: no such patch in the series"))
            elif j == i:
                problems.append((name, f"Overlay-Requires {req!r} names the patch itself"))
            elif j > i:
                problems.append(
                    (
                        name,
                        (
                            f"Overlay-Requires {req!r}: that patch comes after it "
                            f"(position {j + 1}, this one is {i + 1})"
                        ),
                    )
                )
    return problems
