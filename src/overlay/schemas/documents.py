"""The JSON documents overlay writes and reads back, as types: one definition for the code (mypy checks every
producer against it) and for the JSON Schemas shipped beside this module (generated from these types by
``python -m overlay.schemas``, validated against real documents in the tests).

Imports nothing from overlay: every layer may use these types.
"""

from typing import Any, Literal, NotRequired, TypedDict

# ------------------------------------------------------------------ provenance (.dist-info/overlay.json)


class Tool(TypedDict):
    name: str
    version: str


class ArtifactRef(TypedDict):
    filename: str
    sha256: str


class ProvenanceUpstream(TypedDict):
    distribution: str
    version: str
    commit: str | None
    artifact: ArtifactRef | None


class ArtifactSource(TypedDict):
    kind: Literal["artifact"]
    filename: str


class GitSource(TypedDict):
    kind: Literal["git"]
    url: str
    commit: str


class ProvenancePatch(TypedDict):
    name: str
    sha256: str
    subject: str
    theme: str | None
    numerics: str | None
    upstream_status: str | None


class ProvenanceSeries(TypedDict):
    sha256: str
    patches: list[ProvenancePatch]
    order: NotRequired[int]  # the ORDER of the local version (overlay.core.versions); absent in older wheels


class LintProblem(TypedDict):
    patch: str | None  # None: a problem of the series, not of one patch
    kind: str
    message: str


class LintWaiver(TypedDict):
    allowed_unlinted: Literal[True]
    problems: list[LintProblem]


class Provenance(TypedDict):
    """``.dist-info/overlay.json`` in a patched wheel."""

    version: Literal[1]
    tool: Tool
    engine: str
    upstream: ProvenanceUpstream
    source: ArtifactSource | GitSource
    series: ProvenanceSeries
    prebuilt: NotRequired[dict[str, Any]]  # what the manifest's [prebuilt] command added and reported
    lint: NotRequired[LintWaiver]  # only when built with --allow-unlinted


# ------------------------------------------------------------------ checkout and refresh


class CheckoutPatch(TypedDict):
    commit: str
    name: str
    sha256: str


class CheckoutState(TypedDict):
    """``overlay-checkout.json`` in a checkout worktree's .git folder."""

    version: Literal[1]
    engine: str
    upstream: str
    base: str
    upto: int | None
    patches: list[CheckoutPatch]
    rest: list[str]


class JournalTarget(TypedDict):
    path: str
    key: str
    backup: bool
    remove: bool


class RefreshJournal(TypedDict):
    """``build/refresh/ENGINE/journal.json``, present only while a refresh publishes (or after it was killed)."""

    version: Literal[1]
    engine: str
    status: Literal["publishing"]
    targets: list[JournalTarget]


# ------------------------------------------------------------------ rebase

PatchClass = Literal["clean", "offset", "merged", "conflict", "upstreamed", "obsolete"]
Resolution = Literal["auto", "pending", "user", "dropped", "skipped"]


class Artifact(TypedDict):
    filename: str
    sha256: str
    url: NotRequired[str]


# keys that are Python keywords ("from", "class") need TypedDict's functional form; the classes below extend them
Offset = TypedDict("Offset", {"path": str, "hunk": int, "from": int, "to": int, "offset": int})
Rename = TypedDict("Rename", {"from": str, "to": str, "similarity": int})
_OutcomeClass = TypedDict("_OutcomeClass", {"class": PatchClass})


class MovedHunk(TypedDict):
    path: str
    hunk: int
    before: list[str]
    after: list[str]


class OutcomeDoc(_OutcomeClass):
    name: str
    new_name: str | None
    subject: str
    detail: str
    resolution: Resolution
    old_commit: str | None
    commit: str | None
    kept_bytes: bool
    offsets: list[Offset]
    renames: list[Rename]
    gone: list[str]
    conflicts: list[str]
    moved_hunks: list[MovedHunk]
    conflict_kind: Literal["own", "inherited"] | None
    inherited_from: list[str]


class FromRelease(TypedDict):
    version: str
    artifact: NotRequired[Artifact]


class ToRelease(TypedDict):
    version: str
    artifacts: list[Artifact]
    commit: NotRequired[str | None]


_FromTo = TypedDict("_FromTo", {"from": FromRelease, "to": ToRelease})


class Snapshot(TypedDict):
    manifest: str
    series: dict[str, str]


class StatePatch(TypedDict):
    name: str
    sha256: str


class RebaseState(_FromTo):
    """``build/rebase/ENGINE/state.json``: a rebase in progress."""

    version: Literal[1]
    engine: str
    status: Literal["running", "stopped", "review", "publishing"]
    started: float
    seconds: float
    old_base: str
    new_base: str
    old_commits: list[str]
    renames: dict[str, list[Any]]  # old path -> [new path, similarity %]
    patches: list[StatePatch]
    snapshot: Snapshot
    outcomes: list[OutcomeDoc]
    head: str
    review: NotRequired[list[str]]


class ReportPatch(OutcomeDoc):
    upstream_status: str | None


NotReached = TypedDict("NotReached", {"name": str, "class": None, "resolution": Literal["not reached"]})


class ConflictCounts(TypedDict):
    own: int
    inherited: int


class Stopped(_OutcomeClass):
    patch: str
    detail: str
    paths: list[str]
    worktree: str | None


class Bases(TypedDict):
    old: str
    new: str


class RebaseReport(_FromTo):
    """``build/reports/ENGINE-rebase.json`` (and what ``overlay rebase --json`` prints)."""

    version: Literal[1]
    engine: str
    status: Literal["published", "stopped", "review", "dry-run"]
    patches: list[ReportPatch | NotReached]
    counts: dict[str, int]
    conflicts: ConflictCounts
    stopped: Stopped | None
    series: list[str]
    bases: Bases | None
    seconds: float
    warnings: list[str]
    review: list[str]


# ------------------------------------------------------------------ review


class ReviewHunk(TypedDict):
    path: str
    hunk: int
    line: int
    symbols: list[str]


class ReviewPatch(TypedDict):
    name: str
    subject: str
    rebase_class: str | None
    rebase_detail: str | None
    hunks: list[ReviewHunk]


class ReviewFile(TypedDict):
    path: str
    new_path: str | None
    status: Literal["unchanged", "changed", "renamed", "deleted", "added-upstream", "added-by-series"]
    added: int
    removed: int
    patches: list[str]


class ReviewSymbol(TypedDict):
    path: str
    symbol: str
    kind: str | None  # "function" or "class"; None for module-level code
    status: str
    flagged: bool
    new_path: str | None
    new_symbol: str | None
    similarity: float
    added: int
    removed: int
    signature: list[str] | None
    note: str
    patches: list[str]
    summary: str


class ElsewhereChange(TypedDict):
    symbol: str
    status: str
    new_symbol: str | None
    added: int
    removed: int
    summary: str


class Elsewhere(TypedDict):
    path: str
    new_path: str | None
    changes: list[ElsewhereChange]


class DuplicateDoc(TypedDict):
    patch: str
    evidence: Literal["reverse-applies", "ast-equivalent", "added-lines", "empty-merge"]
    detail: str


class RangeDiffDoc(TypedDict):
    old: str | None
    new: str | None
    marker: str
    kind: Literal["identical", "context-only", "changed", "dropped", "added"]
    subject: str
    note: str
    moved_hunks: list[MovedHunk]
    text: str


ReviewSeries = TypedDict("ReviewSeries", {"from": str | None, "to": str | None})
_ReviewFromTo = TypedDict("_ReviewFromTo", {"from": str, "to": str})


class ReviewReport(_ReviewFromTo):
    """``build/reports/ENGINE-review.json`` (and what ``overlay review --json`` prints)."""

    version: Literal[1]
    engine: str
    anchor: Literal["old", "new"]
    series: ReviewSeries
    notes: list[str]
    patches: list[ReviewPatch]
    files: list[ReviewFile]
    symbols: list[ReviewSymbol]
    flags: list[str]
    flagged: int
    unchanged: int
    elsewhere: list[Elsewhere]
    duplicates: list[DuplicateDoc]
    range_diff: list[RangeDiffDoc] | None
    seconds: float


DOCUMENTS: dict[str, type] = {
    "provenance": Provenance,
    "checkout-state": CheckoutState,
    "refresh-journal": RefreshJournal,
    "rebase-state": RebaseState,
    "rebase-report": RebaseReport,
    "review-report": ReviewReport,
}


# ------------------------------------------------------------------ the worker protocol (overlay check <-> an arm)
# One JSON request on a worker's stdin (src/overlay/engines/workers/*_worker.py, run by the arm's interpreter), one
# JSON document on its stdout. `options` carries the patched arm's CLI-option flags (overlay check --flags).

Options = dict[str, str | None]


class TokenizeRequest(TypedDict):
    task: Literal["tokenize"]
    model: str
    prompts: list[str]
    options: NotRequired[Options]


class GreedyRequest(TypedDict):
    task: Literal["greedy"]
    model: str
    prompts: list[list[int]]
    max_tokens: int
    out: str  # a folder the worker writes its per-prompt files into
    options: NotRequired[Options]


class LogitsRequest(TypedDict):
    task: Literal["logits"]
    model: str
    sequences: list[list[int]]
    vocab_size: int | None
    out: str
    options: NotRequired[Options]


class SpecRequest(TypedDict):
    task: Literal["spec"]
    model: str
    drafts: dict[str, str]  # label -> drafter checkpoint
    prompts: list[list[int]]
    k: int
    max_tokens: int
    adaptive_draft: NotRequired[bool]  # mlx-lm: the patched adaptive draft-length controller
    options: NotRequired[Options]


class SpeedRequest(TypedDict):
    task: Literal["speed"]
    model: str
    prompt: list[int]
    decode_tokens: int
    inner_reps: NotRequired[int]  # timed repetitions after the warm-up (the workers' default: 3)
    options: NotRequired[Options]


class ColdRequest(TypedDict):
    task: Literal["cold"]
    model: str
    prompt: list[int]
    options: NotRequired[Options]


class CensusRequest(TypedDict):
    task: Literal["census"]
    model: str
    scenario: str
    steps: int
    options: NotRequired[Options]
    # a census variant's own settings (overlay.check.census.Variant.extra)
    draft: NotRequired[str]
    # sglang: the spec scenarios' algorithm (default STANDALONE; NEXTN: ``model`` is a checkpoint with NextN layers)
    algorithm: NotRequired[Literal["STANDALONE", "NEXTN"]]
    # sglang: the spec scenarios' attention backend (default intel_amx; triton: needs_cpu_seq_lens False, its kernels
    # run in Triton's CPU interpreter; torch_native is refused for EAGLE-family algorithms)
    attention_backend: NotRequired[Literal["intel_amx", "triton"]]
    drafter_layers: NotRequired[Literal["ring", "paged"]]
    # exllamav3: the ring drafter's rings quantized (k_bits, v_bits), and the batch size (default 2)
    ring_bits: NotRequired[list[int]]
    bsz: NotRequired[int]
    # exllamav3: draft-round with an MTP drafter (workers/exllamav3_census_mtp.py): depths per round, the jobs' K/V
    # positions, the BC decode graph stood in (default off: the dispatch path)
    drafter: NotRequired[Literal["mtp"]]
    depths: NotRequired[int]
    context: NotRequired[int]
    bc_mla: NotRequired[bool]
    sampler: NotRequired[dict[str, Any]]
    # the mlx-lm census's own knobs (its defaults when absent): prompt text, prefill chunk, draft length, prompt length
    prompt_text: NotRequired[str]
    chunk: NotRequired[int]
    num_draft: NotRequired[int]  # sglang too: the spec scenarios' draft steps per cycle (default 1)
    prompt_tokens: NotRequired[int]


WorkerRequest = (
    TokenizeRequest | GreedyRequest | LogitsRequest | SpecRequest | SpeedRequest | ColdRequest | CensusRequest
)

DOCUMENTS["worker-request"] = WorkerRequest  # type: ignore[assignment]
