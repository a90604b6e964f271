"""The mechanism gate on a torch engine, for real: `overlay check exllamav3 --mechanism` over a series built here.

A six-patch series over the pinned ExLlamaV3 1.6.5 wheel (tmp_path repository made with `overlay checkout` and
`overlay refresh`; the arms' venvs and the artifact cache are this repository's build/), each patch opt-in behind an
EXL3_OVL_SELFTEST_* flag on the path the ExLlamaV3 census runs (workers/exllamav3_census.py: the wheel's own
Generator.iterate_gen and iterate_draftmodel_dflash_gen on CPU with the labelled stand-ins):

- a patch declaring ``host-syncs decreases in spec-verify-step`` whose flagged code reads a device tensor with
  ``.item()`` per job: the gate fails (exit 4) naming it; its twin reads a *host* tensor with ``.item()`` and declares
  ``unchanged``: it holds (the census tells a host read of device data from host work);
- a patch declaring ``eager-launches decreases in spec-verify-step`` that adds one op (a clone of the logits): fails,
  after = before + 1 per step;
- a patch declaring ``capturable becomes-true in draft-round`` that wraps the drafts' crop in ``torch.cuda.graph``
  but reads the host inside it: the capture region is measured (False, the call site in generator.py) and the gate
  fails; its twin captures device work only: True, it holds; a third captures the target's forward in the verify
  step, which the census stands in (the drafter's forward is real device ops there and is judged), whose
  work is not the real one's: not measured (the census alone would call it capturable), never holding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.long]  # minutes on 2 cores: scripts/test_long.sh

GIT_ENV = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
}

# anchors in exllamav3/generator/generator.py (1.6.5) and what each patch inserts after them
VERIFY_JOB = "                W = batch_logits.shape[1]\n"
DEVICE_READ = (
    '                if os.environ.get("EXL3_OVL_SELFTEST_SYNC") == "1":\n'
    "                    _peak = float(job_logits.amax().item())  # reads the device logits\n"
)
HOST_READ = (
    '                if os.environ.get("EXL3_OVL_SELFTEST_HOST") == "1":\n'
    "                    _width = int(torch.tensor(W).item())  # a host tensor: no device read\n"
)
AFTER_FORWARD = '        p_export_states = params.get("export_states")\n'
ONE_MORE_OP = (
    '        if os.environ.get("EXL3_OVL_SELFTEST_LAUNCH") == "1":\n'
    "            batch_logits = batch_logits.clone()\n"
)
DRAFT_COPY = "        self.draft_ids_pinned[:batch_size, :window].copy_(new_ids[:batch_size, :window])\n"
GRAPH_READS_HOST = (
    '        if os.environ.get("EXL3_OVL_SELFTEST_GRAPH") == "1":\n'
    "            with torch.cuda.graph(torch.cuda.CUDAGraph()):\n"
    "                window = min(window, int((new_ids[:batch_size, :window] >= 0).sum(dim = 1).max().item()))\n"
)
GRAPH_DEVICE_ONLY = (
    '        if os.environ.get("EXL3_OVL_SELFTEST_GRAPH_OK") == "1":\n'
    "            with torch.cuda.graph(torch.cuda.CUDAGraph()):\n"
    "                new_ids = new_ids[:batch_size, :window].clone()\n"
)

TARGET_FORWARD = (  # the target's forward in iterate_gen: the census stands it in (the drafter's is real ops)
    "        batch_logits = self.model.forward(\n            input_ids = batch_ids,\n"
    "            params = params,\n        )\n"
)
GRAPH_OF_STANDIN = (
    '        if os.environ.get("EXL3_OVL_SELFTEST_GRAPH_FWD") == "1":\n'
    "            with torch.cuda.graph(torch.cuda.CUDAGraph()):\n"
    "                batch_logits = self.model.forward(input_ids = batch_ids, params = params)\n"
)

PATCHES = [  # (subject, theme, flag, mechanism, anchor, insertion)
    (
        "generator: claims fewer verify syncs but reads the logits per job",
        "h2d-sync",
        "EXL3_OVL_SELFTEST_SYNC=1",
        "host-syncs decreases in spec-verify-step",
        VERIFY_JOB,
        DEVICE_READ,
    ),
    (
        "generator: a host-side width read, syncs unchanged",
        "h2d-sync",
        "EXL3_OVL_SELFTEST_HOST=1",
        "host-syncs unchanged in spec-verify-step",
        VERIFY_JOB,
        HOST_READ,
    ),
    (
        "generator: claims fewer launches but clones the logits",
        "sampling-fusion",
        "EXL3_OVL_SELFTEST_LAUNCH=1",
        "eager-launches decreases in spec-verify-step",
        AFTER_FORWARD,
        ONE_MORE_OP,
    ),
    (
        "generator: the drafts' crop as a CUDA graph that reads the host",
        "cuda-graph",
        "EXL3_OVL_SELFTEST_GRAPH=1",
        "capturable becomes-true in draft-round",
        DRAFT_COPY,
        GRAPH_READS_HOST,
    ),
    (
        "generator: the drafts' crop as a CUDA graph, device work only",
        "cuda-graph",
        "EXL3_OVL_SELFTEST_GRAPH_OK=1",
        "capturable becomes-true in draft-round",
        DRAFT_COPY,
        GRAPH_DEVICE_ONLY,
    ),
    (
        "generator: the target's forward as a CUDA graph",
        "cuda-graph",
        "EXL3_OVL_SELFTEST_GRAPH_FWD=1",
        "capturable becomes-true in spec-verify-step",
        TARGET_FORWARD,
        GRAPH_OF_STANDIN,
    ),
]


def _commit(wt: Path, subject: str, theme: str, flag: str, mechanism: str) -> None:
    msg = (
        f"{subject}\n\nTest fixture of tests/census/test_gate_torch.py.\n\nOverlay-Theme: {theme}\n"
        "Overlay-Numerics: exact\nOverlay-Check: tests/census/test_gate_torch.py\n"
        f"Upstream-Status: Inappropriate test fixture\nOverlay-Flag: {flag}\nOverlay-Mechanism: {mechanism}\n"
    )
    subprocess.run(["git", "commit", "-qam", msg], cwd=wt, env={**os.environ, **GIT_ENV}, check=True)


def _repo(tmp_path: Path) -> Path:
    """An overlay repository with this one's exllamav3 manifest (pin, runtime, stand-in path) and an empty series."""
    root = tmp_path / "repo"
    (root / "overlays").mkdir(parents=True)
    shutil.copy(REPO / "overlays" / "exllamav3.toml", root / "overlays" / "exllamav3.toml")
    (root / "patches" / "exllamav3").mkdir(parents=True)
    base = (REPO / "patches" / "exllamav3" / "series").read_text().splitlines()[0]
    (root / "patches" / "exllamav3" / "series").write_text(base + "\n")
    standin = Path(
        "support/testbackends/exllamav3/pythonpath"
    )  # runtime.python-path: must lie inside the root
    shutil.copytree(REPO / standin, root / standin)
    (root / "tests" / "census").mkdir(
        parents=True
    )  # the fixtures' Overlay-Check names this file: lint wants it
    shutil.copy(Path(__file__), root / "tests" / "census" / Path(__file__).name)
    (root / "build").mkdir()
    for d in ("cache", "venvs"):
        (REPO / "build" / d).mkdir(parents=True, exist_ok=True)
        (root / "build" / d).symlink_to(REPO / "build" / d)
    return root


def test_the_torch_census_gate_names_each_wrong_declaration(tmp_path: Path, cli: Any) -> None:
    root = _repo(tmp_path)
    wt = Path(cli("--root", str(root), "-q", "checkout", "exllamav3").out.strip())
    gen = wt / "exllamav3" / "generator" / "generator.py"
    for subject, theme, flag, mechanism, anchor, insertion in PATCHES:
        text = gen.read_text()
        assert text.count(anchor) == 1, anchor
        gen.write_text(text.replace(anchor, anchor + insertion))
        _commit(wt, subject, theme, flag, mechanism)
    assert cli("--root", str(root), "-q", "refresh", "exllamav3").code == 0
    names = (root / "patches" / "exllamav3" / "series").read_text().splitlines()[1:]
    assert len(names) == len(PATCHES)

    r = cli("--root", str(root), "check", "exllamav3", "--mechanism", "--census-steps", "2")
    assert r.code == 4, r.err + r.out
    report = json.loads((root / "build" / "reports" / "exllamav3-check.json").read_text())
    assert report["mode"] == "mechanism" and report["verdict"] == "fail"
    by = {rec["patch"]: rec for rec in report["mechanism"]}
    device_read, host_read, more_ops, graph_reads, graph_ok, graph_standin = (by[n] for n in names)

    # (a) .item() on the device logits, once per job (bsz 2): 2 -> 4 syncs, at the inserted line
    assert device_read["holds"] is False and device_read["before"] == device_read["stock"] == 2.0
    assert device_read["after"] == device_read["before"] + 2
    line = gen.read_text().splitlines().index(DEVICE_READ.splitlines()[1]) + 1
    assert [
        site for site, _n in device_read["sites"]["after"] if site not in dict(device_read["sites"]["before"])
    ] == [f"exllamav3/generator/generator.py:{line}"]
    # ... the same call on a host tensor is no sync: the honest twin holds
    assert host_read["holds"] is True and host_read["after"] == host_read["before"] == 2.0

    # (c) one clone of the logits per verify step: one launch more, never fewer
    assert more_ops["holds"] is False and more_ops["after"] == more_ops["before"] + 1

    # (b) the capture region is measured, not claimed: a host read inside it makes it uncapturable
    assert graph_reads["before"] is None and graph_reads["after"] is False and graph_reads["holds"] is False
    violations = graph_reads["detail"]["after"]["violations"]
    assert violations and all(
        v.startswith("host sync") and "exllamav3/generator/generator.py:" in v for v in violations
    )
    assert graph_reads["detail"]["before"]["violations"] == []
    assert graph_ok["before"] is None and graph_ok["after"] is True and graph_ok["holds"] is True
    # ... and a region around a stood-in forward is not judged: the counts alone would call it capturable
    assert graph_standin["holds"] is None and graph_standin["after"] is None
    assert graph_standin["detail"]["after"]["uncounted"]["capturable"] is True

    failed = {g["subject"] for g in report["gates"] if not g["passed"]}
    assert failed == {names[0], names[2], names[3]}
    assert {
        k: report["mechanism_summary"][k] for k in ("declared", "hold", "do_not_hold", "not_measured")
    } == {"declared": 6, "hold": 2, "do_not_hold": 3, "not_measured": 1}
    for name in (names[0], names[2], names[3]):
        assert f"mechanism DOES NOT HOLD {name[:48]}" in r.out
    assert names[0] in r.err
