"""Environments for running an engine: one shared deps venv per engine, and one thin venv per arm.

- The deps venv (build/venvs/ENGINE-deps-HASH) holds the manifest's ``[runtime] requirements``, installed with pip.
- An arm venv (build/venvs/ENGINE-arm-WHEELSHA) is a real venv whose own site-packages holds exactly one engine wheel,
  installed with pip (--no-deps); a ``.pth`` file puts the deps venv's site-packages after it on sys.path. Stock and
  patched arms therefore share every dependency byte for byte and differ only in the engine.

Both are cached: a venv is published (its ``.overlay-ready`` marker written) only after every install succeeded, and a
half-built one (killed run) is removed and rebuilt. A file lock keeps parallel test workers from building the same one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from overlay.core.manifest import Manifest
from overlay.errors import ExternalCommandError, UsageError
from overlay.fsutil import file_lock, sha256_file
from overlay.paths import layout
from overlay.proc import run_step
from overlay.progress import NullReporter, Reporter

READY = ".overlay-ready"
ENV_SCHEMA = 2  # bump to invalidate cached venvs when their layout changes


@dataclass(frozen=True)
class Arm:
    """One installed engine: a venv holding one wheel, plus how to run code in it."""

    name: str
    engine: str
    venv: Path
    wheel: Path
    version: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return _site_packages(self.venv)

    def with_env(self, env: Mapping[str, str] | None) -> Arm:
        """This arm with ``env`` set on top of its own environment (itself when ``env`` is empty)."""
        return replace(self, env={**self.env, **env}) if env else self

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float | None = None,
        extra_env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python argv...`` in this arm (a fresh process). Does not raise on a non-zero exit."""
        env = {**os.environ, **self.env, **(extra_env or {})}
        env.pop("PYTHONHOME", None)
        return subprocess.run(
            [str(self.python), *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
        )

    def run_json(
        self,
        script: Path | str,
        payload: Any = None,
        *,
        timeout: float | None = 900,
        extra_env: Mapping[str, str] | None = None,
    ) -> Any:
        """Run ``script`` with ``payload`` as JSON on stdin; return the JSON document it prints on stdout."""
        proc = self.run([str(script)], input=json.dumps(payload), timeout=timeout, extra_env=extra_env)
        return self._json_of(proc, Path(script).name)

    def run_code_json(
        self, code: str, *args: str, timeout: float | None = 900, extra_env: Mapping[str, str] | None = None
    ) -> Any:
        """Run ``python -c code args...`` with the arm's interpreter; return the JSON document it prints on stdout
        (the whole output or its last line)."""
        proc = self.run(["-c", code, *args], timeout=timeout, extra_env=extra_env)
        return self._json_of(proc, "python -c")

    def _json_of(self, proc: subprocess.CompletedProcess[str], what: str) -> Any:
        if proc.returncode != 0:
            raise ExternalCommandError(
                f"{what} failed in the {self.name} arm ({self.version}), exit {proc.returncode}:\n"
                f"{proc.stderr.strip()[-4000:]}"
            )
        text = proc.stdout.strip()
        lines = [line for line in text.splitlines() if line.strip()]
        for candidate in (text, lines[-1] if lines else ""):
            try:
                return json.loads(candidate)
            except json.JSONDecodeError:
                continue
        raise ExternalCommandError(
            f"{what} in the {self.name} arm printed no JSON document on stdout: {text[-1000:]!r}\n"
            f"stderr: {proc.stderr.strip()[-2000:]}"
        )


@dataclass(frozen=True)
class Arms:
    stock: Arm
    patched: Arm


def venvs_dir(root: Path) -> Path:
    return layout(root).venvs


def _site_packages(venv: Path) -> Path:
    v = sys.version_info
    return venv / "lib" / f"python{v.major}.{v.minor}" / "site-packages"


def _base_python() -> str:
    """The interpreter new venvs are made from (the base one when we run inside a venv)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _run(cmd: list[str], what: str, reporter: Reporter, env: Mapping[str, str] | None = None) -> None:
    proc = run_step(cmd, reporter=reporter, stage="env", what=what, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise ExternalCommandError(
            f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-3000:]}",
            tip="check access to the package index (`pip config list`); the partial venv is removed",
        )


def runtime_env(root: Path, manifest: Manifest) -> dict[str, str]:
    """Environment variables an arm runs with: test-backend paths, library preloads, the manifest's env."""
    env: dict[str, str] = {"PYTHONNOUSERSITE": "1"}
    paths = [str(p) for p in manifest.python_path_dirs(root)]  # each resolved and kept inside the root
    for p in paths:
        if not Path(p).is_dir():
            raise UsageError(f"{manifest.path.name}: runtime.python-path entry {p!r} is not a folder")
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    preload = [p for p in manifest.runtime.preload if Path(p).exists()]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    env.update(dict(manifest.runtime.env))
    return env


def deps_env(root: Path, manifest: Manifest, *, reporter: Reporter | None = None) -> Path:
    """The engine's shared deps venv (created on first use)."""
    reporter = reporter or NullReporter()
    reqs = list(manifest.runtime.requirements)
    key = hashlib.sha256(json.dumps([ENV_SCHEMA, sys.version, reqs]).encode()).hexdigest()[:12]
    venv = venvs_dir(root) / f"{manifest.name}-deps-{key}"
    with file_lock(venvs_dir(root) / f".{venv.name}.lock"):
        if (venv / READY).is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        _run(
            [_base_python(), "-m", "venv", str(venv)],
            f"creating {venv.name} ({len(reqs)} requirements)",
            reporter,
        )
        try:
            if reqs:
                _run(
                    [
                        str(venv / "bin" / "python"),
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "-q",
                        *reqs,
                    ],
                    f"installing {manifest.name} runtime requirements into {venv.name}",
                    reporter,
                )
            (venv / READY).write_text(json.dumps({"requirements": reqs}) + "\n")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
    return venv


def arm_env(
    root: Path, manifest: Manifest, wheel: Path, *, name: str, reporter: Reporter | None = None
) -> Arm:
    """A venv with ``wheel`` installed by pip (--no-deps) on top of the shared deps venv."""
    reporter = reporter or NullReporter()
    deps = deps_env(root, manifest, reporter=reporter)
    digest = sha256_file(wheel)
    venv = venvs_dir(root) / f"{manifest.name}-arm-{digest[:16]}-{deps.name.rsplit('-', 1)[1]}"
    from overlay.core.wheels import WheelName

    version = str(WheelName.parse(wheel.name).version)
    env = runtime_env(root, manifest)
    with file_lock(venvs_dir(root) / f".{venv.name}.lock"):
        if not (venv / READY).is_file():
            shutil.rmtree(venv, ignore_errors=True)
            _run(
                [_base_python(), "-m", "venv", "--without-pip", str(venv)],
                f"creating the venv {venv.name}",
                reporter,
            )
            try:
                site = _site_packages(venv)
                (site / "_overlay_deps.pth").write_text(
                    str(_site_packages(deps).resolve()) + "\n"
                )  # .pth: absolute
                _run(
                    [
                        str(venv / "bin" / "python"),
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "-q",
                        "--no-deps",
                        "--no-index",
                        "--no-compile",
                        str(wheel),
                    ],
                    f"installing {wheel.name} into {venv.name}",
                    reporter,
                )
                (venv / READY).write_text(json.dumps({"wheel": wheel.name, "sha256": digest}) + "\n")
            except BaseException:
                shutil.rmtree(venv, ignore_errors=True)
                raise
    return Arm(name=name, engine=manifest.name, venv=venv, wheel=wheel, version=version, env=env)


def arms_for(root: Path, engine: str, *, upto: int | None = None, reporter: Reporter | None = None) -> Arms:
    """Stock (the pinned artifact) and patched (``overlay apply`` of the series, or its first ``upto`` patches, taken
    from the check's wheel cache while its inputs are unchanged)."""
    from overlay.check.wheelcache import patched_wheel
    from overlay.core.fetch import fetch_artifact
    from overlay.core.manifest import load_engine

    manifest = load_engine(root, engine)
    artifact = manifest.upstream.primary
    if not artifact.is_wheel:
        raise UsageError(f"{engine}: arms need a wheel pin")
    stock_wheel = fetch_artifact(root, manifest, artifact, reporter=reporter)
    patched = patched_wheel(root=root, engine=engine, upto=upto, reporter=reporter)
    return Arms(
        stock=arm_env(root, manifest, stock_wheel, name="stock", reporter=reporter),
        patched=arm_env(root, manifest, patched.wheel, name="patched", reporter=reporter),
    )


def python_info() -> str:
    return f"{sys.implementation.name} {sysconfig.get_python_version()}"
