"""`overlay install`, `overlay revert`, `overlay status` in an existing Python environment.

install: the installation there must be the pinned stock one (its files match the pinned artifact's RECORD) or an
unmodified overlay build of the same pin; then the patched wheel of that artifact is installed with pip
(``--no-deps --force-reinstall --no-index``: nothing else is touched, nothing downloaded) and verified: the version,
overlay.json, every file against RECORD, and ``import NAME`` resolving to the installed files.
revert: the pinned stock bytes (the cached, sha256-verified artifact) go back the same way, verified against the
pinned RECORD. status: what every pinned engine is there.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from overlay.core.build import default_out_dir
from overlay.core.fetch import cached_path, fetch_artifact
from overlay.core.manifest import Artifact, Manifest, engine_names, load_engine
from overlay.core.provenance import read_from_wheel
from overlay.deploy.inspect import (
    Installed,
    Target,
    artifact_for,
    describe,
    import_origin,
    inspect_engine,
    probe,
)
from overlay.deploy.publish import current_wheels
from overlay.errors import ExternalCommandError, IntegrityError, OverlayError, UsageError
from overlay.progress import NullReporter, Reporter

Action = Literal["installed", "reverted", "unchanged"]


@dataclass(frozen=True)
class ActionResult:
    action: Action
    before: Installed
    after: Installed
    wheel: Path
    import_path: Path


def _target(python: Path | None) -> Target:
    import sys

    return probe(python or Path(sys.executable))


def _require(installed: Installed | None, manifest: Manifest, target: Target, verb: str) -> Installed:
    if installed is None:
        raise UsageError(
            f"{manifest.distribution} is not installed for {target.python}: `overlay {verb}` replaces an existing, "
            "verified installation",
            tip=f"install the stock engine first (`{target.python} -m pip install {manifest.distribution}=="
            f"{manifest.upstream.version}`), or see docs/deploy.md for a fresh image",
        )
    if installed.editable:
        raise UsageError(
            f"{manifest.distribution} is an editable install at {installed.location}: a source checkout, "
            "not the pinned release",
            tip="uninstall it and install the pinned release first",
        )
    if installed.kind == "other":
        raise UsageError(
            f"{manifest.distribution} {installed.version} is installed for {target.python}, but {manifest.path.name} "
            f"pins {manifest.upstream.version}",
            tip=f"install the pinned release ({manifest.distribution}=={manifest.upstream.version}) first, or pin "
            f"this one (`overlay init {manifest.name} --version {installed.version}`)",
        )
    return installed


def _stock_wheel(
    root: Path, manifest: Manifest, artifact: Artifact | None, *, offline: bool, reporter: Reporter
) -> Path | None:
    if artifact is None:
        return None
    return fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter)


def install_engine(
    *,
    root: Path,
    engine: str,
    python: Path | None = None,
    wheels_dir: Path | None = None,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> ActionResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    target = _target(python)
    before = _require(
        _inspect(root, manifest, target, offline=offline, reporter=reporter), manifest, target, "install"
    )
    if before.kind == "stock" and not before.files_ok:
        raise IntegrityError(
            f"{manifest.distribution} {before.version} at {before.location} is not the pinned stock release: "
            f"{describe(before.record_problems + before.pin_problems)}",
            tip=f"put the pinned bytes back first (`overlay revert {engine} --python {target.python}`)",
        )
    if before.kind == "patched" and before.record_problems:
        raise IntegrityError(
            f"the overlay build {before.version} at {before.location} was modified: "
            f"{describe(before.record_problems)}",
            tip=f"`overlay revert {engine} --python {target.python}` puts the stock bytes back",
        )
    artifact = artifact_for(manifest, before.tags, before.provenance)
    if artifact is None:
        raise UsageError(
            f"no pinned artifact of {manifest.path.name} matches the installed wheel tags "
            f"{sorted(before.tags)}",
            tip="pin the artifact for this Python and platform",
        )
    version, wheels = current_wheels(root, manifest, wheels_dir or default_out_dir(root, engine))
    wheel = next(path for art, path in wheels if art == artifact)
    if before.kind == "patched" and before.version == version:
        after, origin = _verify(manifest, target, before, version=version, reporter=reporter)
        return ActionResult(action="unchanged", before=before, after=after, wheel=wheel, import_path=origin)
    read_from_wheel(wheel)  # RECORD and label once more, right before it is installed
    reporter.step("env", f"installing {wheel.name} into {target.python} (--no-deps)")
    _pip_install(target, wheel)
    now = _inspect(root, manifest, target, offline=offline, reporter=reporter)
    if now is None or now.kind != "patched" or now.version != version:
        raise IntegrityError(
            f"after pip installed {wheel.name}, {target.python} has "
            f"{'nothing' if now is None else now.distribution + ' ' + now.version}",
            tip=f"`overlay status --python {target.python}` shows what is there",
        )
    after, origin = _verify(manifest, target, now, version=version, reporter=reporter)
    return ActionResult(action="installed", before=before, after=after, wheel=wheel, import_path=origin)


def revert_engine(
    *,
    root: Path,
    engine: str,
    python: Path | None = None,
    offline: bool = False,
    reporter: Reporter | None = None,
) -> ActionResult:
    reporter = reporter or NullReporter()
    manifest = load_engine(root, engine)
    target = _target(python)
    before = _require(
        _inspect(root, manifest, target, offline=offline, reporter=reporter), manifest, target, "revert"
    )
    artifact = artifact_for(manifest, before.tags, before.provenance)
    if artifact is None:
        raise UsageError(
            f"no pinned artifact of {manifest.path.name} matches the installed wheel tags "
            f"{sorted(before.tags)}",
            tip="pin the artifact for this Python and platform",
        )
    stock = fetch_artifact(root, manifest, artifact, offline=offline, reporter=reporter)
    if before.kind == "stock" and before.files_ok:
        origin = _check_import(manifest, target, before)
        return ActionResult(action="unchanged", before=before, after=before, wheel=stock, import_path=origin)
    reporter.step("env", f"installing the pinned stock {stock.name} into {target.python} (--no-deps)")
    _pip_install(target, stock)
    after = inspect_engine(target, manifest, stock_wheel=stock)
    if after is None or after.kind != "stock" or not after.files_ok:
        what = (
            "nothing"
            if after is None
            else f"{after.kind} {after.version}: " + describe(after.record_problems + after.pin_problems)
        )
        raise IntegrityError(f"after reinstalling {stock.name}, {target.python} has {what}")
    origin = _check_import(manifest, target, after)
    return ActionResult(action="reverted", before=before, after=after, wheel=stock, import_path=origin)


@dataclass(frozen=True)
class StatusRow:
    engine: str
    installed: Installed | None
    current_version: str | None  # the version the current series builds (None: the series does not load)
    note: str = ""


def status(
    *, root: Path, python: Path | None = None, reporter: Reporter | None = None
) -> tuple[Target, list[StatusRow]]:
    """Every pinned engine's installation for ``python`` (None rows for those not installed)."""
    from overlay.core.provenance import local_version
    from overlay.core.series import load_engine_series

    reporter = reporter or NullReporter()
    target = _target(python)
    rows: list[StatusRow] = []
    for name in engine_names(root):
        manifest = load_engine(root, name)
        try:
            current: str | None = local_version(
                manifest, load_engine_series(root, manifest).patches, root=root
            )
        except OverlayError:
            current = None
        installed = _inspect(root, manifest, target, offline=True, reporter=reporter)
        note = ""
        if installed is not None and installed.kind == "stock" and not installed.pin_checked:
            note = f"not compared with the pin: the artifact is not cached (`overlay fetch {name}`)"
        rows.append(StatusRow(engine=name, installed=installed, current_version=current, note=note))
    return target, rows


def _inspect(
    root: Path, manifest: Manifest, target: Target, *, offline: bool, reporter: Reporter
) -> Installed | None:
    """inspect_engine, with the stock installation compared with its cached pinned artifact (fetched unless offline;
    not compared when offline and not cached)."""
    first = inspect_engine(target, manifest, stock_wheel=None)
    if first is None or first.kind != "stock":
        return first
    artifact = artifact_for(manifest, first.tags, None)
    if artifact is None:
        return first
    if offline and not cached_path(root, artifact).is_file():
        return first
    return inspect_engine(
        target,
        manifest,
        stock_wheel=_stock_wheel(root, manifest, artifact, offline=offline, reporter=reporter),
    )


def _verify(
    manifest: Manifest, target: Target, after: Installed, *, version: str, reporter: Reporter
) -> tuple[Installed, Path]:
    if after.record_problems:
        raise IntegrityError(
            f"{after.distribution} {after.version} at {after.location}: {describe(after.record_problems)}"
        )
    assert after.provenance is not None
    origin = _check_import(manifest, target, after)
    reporter.step(
        "env",
        f"{after.distribution} {version}: overlay.json and every file match RECORD; "
        f"import {manifest.import_name} -> {origin}",
    )
    return after, origin


def _check_import(manifest: Manifest, target: Target, installed: Installed) -> Path:
    origin = import_origin(target, manifest.import_name)
    if origin is None:
        raise IntegrityError(
            f"{target.python}: `import {manifest.import_name}` finds nothing, although "
            f"{installed.distribution} {installed.version} is installed at {installed.location}"
        )
    if not origin.resolve().is_relative_to(installed.location):
        raise IntegrityError(
            f"{target.python}: `import {manifest.import_name}` resolves to {origin}, not to the installed "
            f"{installed.distribution} {installed.version} at {installed.location}: a source checkout or PYTHONPATH "
            "entry shadows the wheel",
            tip="remove that folder from sys.path (PYTHONPATH, a .pth file, the working directory of the server)",
        )
    return origin


def _pip_install(target: Target, wheel: Path) -> None:
    """``PYTHON -m pip install --no-deps --force-reinstall --no-index WHEEL``; for an environment without pip (a uv
    venv), ``uv pip install --python PYTHON --no-deps --reinstall --no-index WHEEL`` when uv is on PATH."""
    import shutil
    import sys

    command = [
        str(target.python),
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--force-reinstall",
        "--no-index",
        "--disable-pip-version-check",
        "--no-input",
        "-q",
        str(wheel),
    ]
    proc = subprocess.run(command, capture_output=True, text=True)
    tool = "pip"
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        beside = Path(sys.executable).parent / "uv"  # installed with overlay, in its venv
        uv = shutil.which("uv") or (str(beside) if beside.is_file() else None)
        if uv is None:
            raise UsageError(
                f"{target.python} has no pip, and uv is not on PATH",
                tip=f"`{target.python} -m ensurepip`, or install uv (`pip install uv`)",
            )
        tool = "uv"
        proc = subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--python",
                str(target.python),
                "--no-deps",
                "--reinstall",
                "--no-index",
                "--no-cache",
                "-q",
                str(wheel),
            ],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()[-1500:]
        raise ExternalCommandError(
            f"{tool} could not install {wheel.name} into {target.python} (exit {proc.returncode}): {err}"
        )
