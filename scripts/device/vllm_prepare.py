"""What the vLLM device check carries, made here (where the package index is reachable) by
``scripts/device_check.sh prepare``; driver side: imports overlay.

The pinned CUDA wheel (``vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl``, 326.5 MB, sha256-verified by ``overlay
fetch``) cannot travel. What the probes need of it does, into ``build/device-carry/vllm/`` (inside the repository, so
the device tool can carry it; ``/build/`` is git-ignored, nothing here is committed):

- ``stock.tar.xz``: the Python files of the stock wheel that the probed modules import (``closure``: their
  module-level imports, followed through the tree, and the imports inside the probed modules' functions), with the
  wheel's ``METADATA`` (vLLM's platform detection reads its version);
- ``patched.tar.xz``: the same closure of the wheel ``overlay apply vllm`` builds from the series, stored as the files
  whose bytes differ from stock's (or that stock lacks); the device rebuilds the patched tree from stock plus these and
  checks every file against ``manifest.json``'s sha256;
- ``deps-cp312.tar.xz``: the packages the vLLM import needs and the GPU image lacks (``VLLM_DEPS``; the image's list
  is in the device tool's KINDS.md; pydantic, msgspec, pyzmq, xgrammar and the rest come in the SGLang set, ``.whl``),
  installed for CPython 3.12 x86_64 by pip into a folder and compressed (smaller than the wheels);
- ``manifest.json``: the wheels' names and hashes, the series digest (a device run refuses a stale carry), the native
  module names the wheel holds (``vllm_native.py`` stands in for them), each tree's files with sha256, the archives'
  sizes.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))

import vllm_native

CARRY = REPO / "build" / "device-carry" / "vllm"
CUDA_WHEEL = "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
MANIFEST_VERSION = 1
# the modules the probes import (vllm_probes.py) and the platforms they run on
PROBED = (
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.sample.ops.penalties",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.metadata",
    "vllm.v1.sample.logits_processor",
    "vllm.model_executor.layers.utils",
    "vllm._custom_ops",
    "vllm.platforms.cuda",
    "vllm.platforms.cpu",
)
# modules whose functions' own imports are followed too (what the probed calls import when they run)
DEEP = (*PROBED, "vllm.utils.import_utils")
# What importing the probed modules of the stock or the patched tree needs that the GPU image lacks (measured: the
# import under Python 3.12, torch 2.11.0+cu130, triton 3.6.0 and transformers 5.17.0, the image's versions, with the
# SGLang set of .whl beside it). Stock alone needs openai, oss-harmony (openai_harmony), httpx2, sniffio, fastapi,
# starlette and llguidance: its vllm.config imports the reasoning parsers and with them the OpenAI protocol modules,
# which 0002 keeps out. The versions are the ones the vLLM arm resolved (overlays/vllm.toml pins most of them).
VLLM_DEPS = (
    "cbor2==6.3.0",
    "cachetools==8.0.2",
    "openai==3.57.0",
    "oss-harmony==0.0.11",
    "httpx2==2.17.0",
    "sniffio==1.3.1",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "llguidance==1.7.6",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_31_x86_64",
)


def cp312_pip(command: str, *args: str, platforms: Sequence[str] = PLATFORMS) -> list[str]:
    """``pip COMMAND`` for the device's interpreter, CPython 3.12 x86_64: binary wheels only, no dependency
    resolution (the device reaches no index: what is named is what travels)."""
    tags = [a for p in platforms for a in ("--platform", p)]
    return [
        sys.executable, "-m", "pip", command, "-q", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", *tags, *args,
    ]  # fmt: skip


class PrepareError(Exception):
    """The vLLM carry cannot be made (the message says why and what to do)."""


# --- the import closure ----------------------------------------------------------------------------------------------


def _module_file(root: Path, name: str) -> Path | None:
    base = root / name.replace(".", "/")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: str, module: str, is_package: bool, *, deep: bool) -> list[str]:
    """The module names an import statement of ``source`` may load: every ``import``/``from`` at module level
    (inside ``if``/``try``/``with`` and class bodies too, not under ``if TYPE_CHECKING:``), and with ``deep`` those
    inside functions too. ``from a import b`` yields ``a`` and ``a.b`` (b may be a submodule)."""
    out: list[str] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(nodes: Iterable[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _type_checking(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if deep:
                    visit(node.body)
                continue
            if isinstance(node, ast.Import):
                out.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = package
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                out.append(base)
                out.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(node, field, None)
                if isinstance(sub, list):
                    visit(sub)
            for handler in getattr(node, "handlers", None) or []:
                visit(handler.body)
            for case in getattr(node, "cases", None) or []:
                visit(case.body)

    visit(ast.parse(source).body)
    return out


def closure(root: Path, start: Iterable[str], *, deep: Iterable[str] = (), top: str = "vllm") -> list[str]:
    """The files (relative to ``root``, sorted) of ``start`` and of every ``top`` module they import (static, see
    ``imported_names``), with the packages above each. A name that is no module of the tree (a class, a function,
    a module the wheel lacks) is skipped."""
    deep = frozenset(deep)
    seen: dict[str, Path | None] = {}
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen or not (name == top or name.startswith(top + ".")):
            continue
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        path = _module_file(root, name)
        seen[name] = path
        if path is not None:
            todo.extend(
                imported_names(
                    path.read_text(encoding="utf-8"), name, path.name == "__init__.py", deep=name in deep
                )
            )
    return sorted({str(p.relative_to(root)) for p in seen.values() if p is not None})


# --- archives --------------------------------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def series_digest(root: Path = REPO, engine: str = "vllm") -> str:
    """sha256 over the series file and every patch (a carry made from another series is stale)."""
    folder = root / "patches" / engine
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _extract_python(wheel: Path, into: Path) -> tuple[list[str], str]:
    """The wheel's ``vllm/**/*.py`` and its METADATA under ``into``; returns the native module names and the
    dist-info folder name."""
    natives: list[str] = []
    dist_info = ""
    with zipfile.ZipFile(wheel) as whl:
        for member in whl.namelist():
            top = member.split("/", 1)[0]
            if top.endswith(".dist-info"):
                dist_info = top
            name = vllm_native.module_name(member)
            if name and member.startswith("vllm/"):
                natives.append(name)
            if (member.startswith("vllm/") and member.endswith(".py")) or member == f"{top}/METADATA":
                target = into / member
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(whl.read(member))
    if not dist_info:
        raise PrepareError(f"{wheel.name} has no .dist-info folder: not a wheel")
    return sorted(natives), dist_info


def _tar_xz(path: Path, files: dict[str, bytes]) -> None:
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=9) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mtime = 0
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    os.replace(partial, path)


def _deps_site(into: Path, work: Path) -> list[str]:
    """``VLLM_DEPS`` for CPython 3.12 x86_64, installed by pip into ``into`` (no bytecode); returns the wheel names."""
    wheels = work / "dep-wheels"
    proc = subprocess.run(
        cp312_pip("download", "-d", str(wheels), *VLLM_DEPS), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise PrepareError(
            f"pip could not download vLLM's device dependencies {' '.join(VLLM_DEPS)}: "
            f"{proc.stderr.strip()[-400:]}; check the package index settings (pip config list)"
        )
    names = sorted(p.name for p in wheels.glob("*.whl"))
    proc = subprocess.run(
        cp312_pip(
            "install", "--no-index", "--no-compile", "--target", str(into), *[str(wheels / n) for n in names]
        ),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise PrepareError(
            f"pip could not install the downloaded wheels into {into}: {proc.stderr.strip()[-400:]}"
        )
    for junk in into.glob("bin"):
        shutil.rmtree(junk)
    return names


def prepare(*, offline: bool = False, log: Any = None) -> dict[str, Any]:
    """Make ``CARRY`` (see the module docstring); returns the manifest. Raises PrepareError."""
    from overlay.core.build import apply_engine, select_artifact
    from overlay.core.fetch import fetch_artifact
    from overlay.core.manifest import load_engine
    from overlay.errors import OverlayError

    say = log or (lambda msg: print(f"vllm-prepare: {msg}", file=sys.stderr, flush=True))
    try:
        manifest = load_engine(REPO, "vllm")
        artifact = select_artifact(manifest, CUDA_WHEEL)
        say(f"fetching {CUDA_WHEEL} (326.5 MB once; sha256-verified)")
        stock_wheel = fetch_artifact(REPO, manifest, artifact, offline=offline)
    except OverlayError as exc:
        raise PrepareError(f"the pinned CUDA wheel is not available: {exc}") from exc
    CARRY.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-prepare-") as tmp:
        work = Path(tmp)
        try:
            patched_wheel = apply_engine(
                root=REPO,
                engine="vllm",
                artifact_name=CUDA_WHEEL,
                out_dir=work / "patched-wheel",
                offline=True,
            ).wheel
        except OverlayError as exc:
            raise PrepareError(f"`overlay apply vllm` failed on the CUDA wheel: {exc}") from exc
        say(f"patched CUDA wheel: {patched_wheel.name}")
        natives, stock_info = _extract_python(stock_wheel, work / "stock")
        _, patched_info = _extract_python(patched_wheel, work / "patched")
        files = {
            arm: closure(work / arm, PROBED, deep=DEEP) + [f"{info}/METADATA"]
            for arm, info in (("stock", stock_info), ("patched", patched_info))
        }
        data = {arm: {f: (work / arm / f).read_bytes() for f in files[arm]} for arm in files}
        stock_data, patched_data = data["stock"], data["patched"]
        delta = {f: b for f, b in patched_data.items() if stock_data.get(f) != b}
        say(
            f"closure: {len(stock_data)} stock files, {len(patched_data)} patched ({len(delta)} differ from stock); "
            f"{len(natives)} native modules stood in"
        )
        _tar_xz(CARRY / "stock.tar.xz", stock_data)
        _tar_xz(CARRY / "patched.tar.xz", delta)
        say(f"dependencies for the GPU image: {' '.join(VLLM_DEPS)}")
        site = work / "site"
        wheels = _deps_site(site, work)
        deps = {
            str(p.relative_to(site)): p.read_bytes()
            for p in sorted(site.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }
        _tar_xz(CARRY / "deps-cp312.tar.xz", deps)
    doc = {
        "version": MANIFEST_VERSION,
        "kind": "vllm-device-carry",
        "wheels": {
            "stock": {"name": stock_wheel.name, "sha256": artifact.sha256},
            "patched": {"name": patched_wheel.name},
        },
        "series_digest": series_digest(),
        "native_modules": natives,
        "probed": list(PROBED),
        "files": {arm: {f: _sha256(b) for f, b in data[arm].items()} for arm in data},
        "deps": {"wheels": wheels, "python": "cp312"},
        "archives": {
            p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p.read_bytes())}
            for p in sorted(CARRY.glob("*.tar.xz"))
        },
    }
    partial = CARRY / "manifest.json.partial"
    partial.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(partial, CARRY / "manifest.json")
    return doc


def carry_bytes(folder: Path = CARRY) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0


def stale(folder: Path = CARRY) -> str | None:
    """Why the carry cannot be used as it is (None: it can)."""
    path = folder / "manifest.json"
    if not path.is_file():
        return f"not prepared: {path.relative_to(REPO)} is missing; run `bash scripts/device_check.sh prepare` here"
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        return f"{path.relative_to(REPO)} is not JSON ({exc}); run prepare again"
    if doc.get("version") != MANIFEST_VERSION:
        return (
            f"{path.relative_to(REPO)} has version {doc.get('version')}, this script reads {MANIFEST_VERSION}"
        )
    if doc.get("series_digest") != series_digest():
        return "stale: patches/vllm changed since the carry was prepared; run `bash scripts/device_check.sh prepare`"
    for name, info in (doc.get("archives") or {}).items():
        archive = folder / name
        if not archive.is_file() or archive.stat().st_size != info["bytes"]:
            return f"{archive.relative_to(REPO)} is missing or not the prepared one; run prepare again"
    return None


if __name__ == "__main__":
    try:
        result = prepare(offline="--offline" in sys.argv[1:])
    except PrepareError as err:
        print(f"vllm-prepare: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps({k: result[k] for k in ("wheels", "archives", "deps")}, indent=2))
