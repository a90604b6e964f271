"""The shipped JSON Schemas are generated from the document types, and real documents (made by the real commands on
synthetic upstreams) validate against them."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from overlay.schemas import DOCUMENTS, load, render
from overlay.schemas.__main__ import main as schemas_main
from rebase_support import add_patches, make_rebase_world, make_release
from support import Cli, World


def _valid(name: str, doc: Any) -> None:
    jsonschema.Draft202012Validator(load(name)).validate(doc)


def test_shipped_schemas_are_generated_from_the_types() -> None:
    assert schemas_main(["--check"]) == 0, "run `python -m overlay.schemas`"
    for name in DOCUMENTS:
        jsonschema.Draft202012Validator.check_schema(load(name))
        assert load(name) == json.loads(render(name))


def test_a_schema_refuses_what_its_type_refuses() -> None:
    journal = {
        "version": 1,
        "engine": "demo",
        "status": "publishing",
        "targets": [{"path": "/x", "key": "0000-x", "backup": True, "remove": False}],
    }
    _valid("refresh-journal", journal)
    for broken in (
        {**journal, "status": "done"},
        {**journal, "extra": 1},
        {k: v for k, v in journal.items() if k != "targets"},
        {**journal, "targets": [{"path": "/x", "key": "k", "backup": "yes", "remove": False}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            _valid("refresh-journal", broken)


def test_provenance_and_checkout_state(world2: World, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    root = ["--root", str(world2.root)]
    r = cli(*root, "apply", "demo")
    assert r.code == 0, r.err
    (wheel,) = (world2.root / "build" / "wheels" / "demo").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        _valid(
            "provenance", json.loads(zf.read(next(n for n in zf.namelist() if n.endswith("/overlay.json"))))
        )
    wt = Path(cli(*root, "-q", "checkout", "demo").out.strip())
    _valid("checkout-state", json.loads((wt / ".git" / "overlay-checkout.json").read_text()))

    import overlay.stack.transaction as txn

    seen: list[Any] = []
    from overlay.fsutil import publish_file as real

    def capture(
        src: Path, dst: Path
    ) -> None:  # the journal is on disk while the files are renamed into place
        seen.append(json.loads((txn.refresh_txn_dir(world2.root, "demo") / txn.JOURNAL).read_text()))
        real(src, dst)

    monkeypatch.setattr(txn, "publish_file", capture)
    (wt / "python" / "demo_pkg" / "__init__.py").write_text("# edited\n", encoding="utf-8")
    from support import git

    git(wt, "commit", "-qam", "edit")
    assert cli(*root, "refresh", "demo").code == 0
    assert seen
    _valid("refresh-journal", seen[0])


def test_rebase_state_report_and_review_report(tmp_path: Path, cli: Cli) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["util", "clean", "conflict"])
    release = make_release(world)
    root = ["--root", str(world.root)]
    r = cli(*root, "rebase", "demo", "--to", "1.3.0", "--url", release.as_uri())
    assert r.code == 3, r.err
    _valid("rebase-state", json.loads((world.root / "build" / "rebase" / "demo" / "state.json").read_text()))
    _valid("rebase-report", json.loads((world.root / "build" / "reports" / "demo-rebase.json").read_text()))
    assert cli(*root, "rebase", "demo", "--abort").code == 0
    r = cli(*root, "-q", "review", "demo", "--from", "1.2.0", "--to", "1.3.0", "--to-url", release.as_uri())
    assert r.code == 0, r.err
    _valid("review-report", json.loads((world.root / "build" / "reports" / "demo-review.json").read_text()))


def test_the_census_requests_are_worker_requests(tmp_path: Path) -> None:
    """What the census sends a worker (the real request builder, every variant shape) validates; a task no worker
    knows does not."""
    from overlay.check.census import Census, Variant
    from overlay.check.envs import Arm

    sent: list[Any] = []

    def run(arm: Arm, request: Any) -> dict[str, Any]:
        sent.append(request)
        return {
            "scenario": request["scenario"],
            "steps": request["steps"],
            "metrics": {},
            "sites": {},
            "notes": [],
        }

    variants = [
        Variant(name="plain", model="m"),
        Variant(name="drafter", model="m", extra=(("draft", "/d"),)),
        Variant(name="sampled", model="m", extra=(("sampler", {"temp": 0.7, "top_k": 20}),)),
        Variant(name="ring", model="", extra=(("drafter_layers", "ring"),)),
    ]
    census = Census(run, variants=variants, steps=3)
    arm = Arm(name="stock", engine="demo", venv=tmp_path, wheel=tmp_path / "w.whl", version="1")
    for v in variants:
        census.measure(arm, "decode-step", None, v)
    assert len(sent) == 4
    for request in sent:
        _valid("worker-request", request)
    with pytest.raises(jsonschema.ValidationError):
        _valid("worker-request", {**sent[0], "task": "train"})
    with pytest.raises(jsonschema.ValidationError):
        _valid(
            "worker-request", {"task": "greedy", "model": "m", "prompts": [[1, 2]], "max_tokens": 4}
        )  # no out
