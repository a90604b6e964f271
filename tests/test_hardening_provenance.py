"""Provenance is verified, not trusted (issue 11, class 7), and apply holds the line lint holds (class 9)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from overlay.core.wheels import read_wheel
from overlay.errors import IntegrityError
from support import Cli, World, make_wheel


def _build(world: World, cli: Cli, out: Path, *extra: str) -> Path:
    r = cli("--root", str(world.root), "-q", "apply", "demo", "--out", str(out), *extra)
    assert r.code == 0, r.err
    return Path(r.out.strip().splitlines()[-1])


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _record(files: dict[str, bytes], record_name: str) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for name, data in files.items():
        if name != record_name:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            w.writerow([name, f"sha256={digest}", len(data)])
    w.writerow([record_name, "", ""])
    return buf.getvalue().encode()


def _rewrite(wheel: Path, out: Path, files: dict[str, bytes]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out


def _forged(wheel: Path, tmp: Path, *, consistent_record: bool) -> Path:
    """The wheel with one patch dropped from overlay.json (its +ovl.N label kept), RECORD regenerated or left as is."""
    files = _members(wheel)
    prov_name = next(n for n in files if n.endswith(".dist-info/overlay.json"))
    record_name = prov_name.rsplit("/", 1)[0] + "/RECORD"
    prov = json.loads(files[prov_name])
    prov["series"]["patches"] = prov["series"]["patches"][:-1]
    files[prov_name] = (json.dumps(prov, indent=2) + "\n").encode()
    if consistent_record:
        files[record_name] = _record(files, record_name)
    return _rewrite(wheel, tmp / ("consistent" if consistent_record else "inconsistent") / wheel.name, files)


def test_untouched_wheel_verifies(world2: World, cli: Cli, tmp_path: Path) -> None:
    wheel = _build(world2, cli, tmp_path / "w")
    r = cli("--root", str(world2.root), "provenance", str(wheel))
    assert r.code == 0, r.err
    assert "verified: every file against RECORD, overlay.json against the version label" in r.out
    r = cli("--root", str(world2.root), "provenance", str(wheel), "--verify")
    assert r.code == 0, r.err
    assert "the patches against patches/ in the overlay repository" in r.out


def test_forged_overlay_json_with_a_consistent_record_exits_5(
    world2: World, cli: Cli, tmp_path: Path
) -> None:
    forged = _forged(_build(world2, cli, tmp_path / "w"), tmp_path, consistent_record=True)
    read_wheel(forged)  # the archive itself is consistent: only the provenance lies
    r = cli("provenance", str(forged))
    assert r.code == 5, r.out
    assert "says 2 patches, overlay.json lists 1" in r.err


def test_forged_overlay_json_with_the_old_record_exits_5(world2: World, cli: Cli, tmp_path: Path) -> None:
    forged = _forged(_build(world2, cli, tmp_path / "w"), tmp_path, consistent_record=False)
    r = cli("provenance", str(forged), "--json")
    assert r.code == 5 and r.out == ""
    assert ".dist-info/overlay.json' does not match its RECORD hash" in r.err


def test_forged_series_hash_and_label_are_caught(world2: World, cli: Cli, tmp_path: Path) -> None:
    wheel = _build(world2, cli, tmp_path / "w")
    files = _members(wheel)
    prov_name = next(n for n in files if n.endswith(".dist-info/overlay.json"))
    record_name = prov_name.rsplit("/", 1)[0] + "/RECORD"
    prov = json.loads(files[prov_name])
    prov["series"]["sha256"] = "0" * 64
    files[prov_name] = (json.dumps(prov) + "\n").encode()
    files[record_name] = _record(files, record_name)
    forged = _rewrite(wheel, tmp_path / "f" / wheel.name, files)
    r = cli("provenance", str(forged))
    assert r.code == 5 and "says series hash g" in r.err and "0" * 64 in r.err


def test_member_missing_from_record_or_listed_but_absent(world2: World, cli: Cli, tmp_path: Path) -> None:
    wheel = _build(world2, cli, tmp_path / "w")
    files = _members(wheel)
    extra = _rewrite(wheel, tmp_path / "x" / wheel.name, {**files, "demo_pkg/backdoor.py": b"import os\n"})
    r = cli("provenance", str(extra))
    assert r.code == 5 and "'demo_pkg/backdoor.py' is not listed in RECORD" in r.err
    dropped = {k: v for k, v in files.items() if k != "demo_pkg/util.py"}
    missing = _rewrite(wheel, tmp_path / "m" / wheel.name, dropped)
    r = cli("provenance", str(missing))
    assert r.code == 5 and "RECORD lists 'demo_pkg/util.py', which the archive does not contain" in r.err


def test_verify_against_modified_patches_exits_5(world2: World, cli: Cli, tmp_path: Path) -> None:
    wheel = _build(world2, cli, tmp_path / "w")
    first, second = sorted(world2.series_dir.glob("*.patch"))
    second.write_bytes(second.read_bytes().replace(b"double by addition", b"double by addition!"))
    r = cli("--root", str(world2.root), "provenance", str(wheel), "--verify")
    assert r.code == 5
    assert (
        f"patch {second.name} has sha256" in r.err
        and first.name not in r.err.split("ERROR", 1)[1].split("TIP")[0]
    )
    second.unlink()
    (world2.series_dir / "series").write_text(f"# base: demo 1.2.0 {world2.base_commit}\n{first.name}\n")
    r = cli("--root", str(world2.root), "provenance", str(wheel), "--verify")
    assert r.code == 5 and f"patch 2 is {second.name!r} in overlay.json" in r.err


def test_upstream_record_is_validated_when_read(world: World, cli: Cli) -> None:
    files = {"demo_pkg/__init__.py": b"X = 1\n", "demo_pkg/core.py": b"def greet(n):\n    return n\n"}
    wheel = make_wheel(world.wheel, files)
    data = _members(wheel)
    data["demo_pkg/core.py"] = b"def greet(n):\n    import os; os.system('id')\n"  # same RECORD, new bytes
    world.wheel.unlink()
    _rewrite(wheel, world.wheel, data)
    world.write_manifest()  # the pin matches the tampered bytes: only RECORD can tell
    r = cli("--root", str(world.root), "apply", "demo")
    assert r.code == 5 and "'demo_pkg/core.py' does not match its RECORD hash" in r.err
    assert not list((world.root / "build" / "wheels").rglob("*.whl"))


def test_record_size_and_hash_algorithm(tmp_path: Path) -> None:
    files = {"demo_pkg/__init__.py": b"X = 1\n"}
    wheel = make_wheel(tmp_path / "a" / "demo_engine-1.2.0-py3-none-any.whl", files)
    data = _members(wheel)
    rec = "demo_engine-1.2.0.dist-info/RECORD"
    data[rec] = data[rec].replace(b",6\n", b",7\n", 1)
    bad = _rewrite(wheel, tmp_path / "b" / wheel.name, data)
    with pytest.raises(IntegrityError, match="is 6 bytes, RECORD says 7"):
        read_wheel(bad)
    data = _members(wheel)
    md5 = base64.urlsafe_b64encode(hashlib.md5(b"X = 1\n").digest()).rstrip(b"=")
    lines = data[rec].split(b"\n")
    lines[0] = b"demo_pkg/__init__.py,md5=" + md5 + b",6"
    data[rec] = b"\n".join(lines)
    with pytest.raises(IntegrityError, match="with 'md5'"):
        read_wheel(_rewrite(wheel, tmp_path / "c" / wheel.name, data))


def _install(wheel: Path, site: Path) -> None:
    """Unpack like an installer does (a purelib wheel): files under site-packages, RECORD as shipped."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)


def test_installed_distribution_is_verified_against_its_record(
    world2: World, cli: Cli, tmp_path: Path
) -> None:
    wheel = _build(world2, cli, tmp_path / "w")
    site = tmp_path / "site"
    _install(wheel, site)
    r = cli("--root", str(world2.root), "provenance", "demo-engine", "--path", str(site), "--verify")
    assert r.code == 0, r.err
    (site / "demo_pkg" / "util.py").write_text("def double(x):\n    return 3 * x\n")
    r = cli("provenance", "demo-engine", "--path", str(site))
    assert r.code == 5 and "'demo_pkg/util.py' does not match its RECORD hash" in r.err
    (site / "demo_pkg" / "util.py").unlink()
    r = cli("provenance", "demo-engine", "--path", str(site))
    assert r.code == 5 and "RECORD lists 'demo_pkg/util.py', which is not on disk" in r.err


def test_installed_forgery_with_a_consistent_record_exits_5(world2: World, cli: Cli, tmp_path: Path) -> None:
    forged = _forged(_build(world2, cli, tmp_path / "w"), tmp_path, consistent_record=True)
    site = tmp_path / "site"
    _install(forged, site)
    r = cli("provenance", "demo-engine", "--path", str(site))
    assert r.code == 5 and "says 2 patches, overlay.json lists 1" in r.err


# ---------------------------------------------------------------- class 9: the lint gate


def _unlinted(world: World) -> str:
    """A patch whose trailers fail lint: Overlay-Numerics has a word lint does not know."""
    patch = sorted(world.series_dir.glob("*.patch"))[1]
    patch.write_bytes(patch.read_bytes().replace(b"Overlay-Numerics: exact", b"Overlay-Numerics: roughly"))
    return patch.name


def test_unlinted_series_does_not_build(world2: World, cli: Cli) -> None:
    name = _unlinted(world2)
    r = cli("--root", str(world2.root), "apply", "demo")
    assert r.code == 2
    assert (
        f"the series does not lint: {name}: Overlay-Numerics 'roughly'" in r.err
        and "--allow-unlinted" in r.err
    )
    assert not list((world2.root / "build" / "wheels").rglob("*.whl"))
    # --upto below the bad patch builds: its problems are not in what is applied
    assert cli("--root", str(world2.root), "-q", "apply", "demo", "--upto", "1").code == 0


def test_allow_unlinted_builds_and_the_provenance_says_so(world2: World, cli: Cli, tmp_path: Path) -> None:
    name = _unlinted(world2)
    wheel = _build(world2, cli, tmp_path / "w", "--allow-unlinted")
    prov = json.loads(next(v for k, v in _members(wheel).items() if k.endswith("overlay.json")))
    assert prov["version"] == 1
    assert prov["lint"]["allowed_unlinted"] is True
    assert [p["patch"] for p in prov["lint"]["problems"]] == [name]
    r = cli("--root", str(world2.root), "provenance", str(wheel))
    assert r.code == 0 and "built with --allow-unlinted; 1 lint problems" in r.out and name in r.out


def test_clean_series_records_no_lint_key(world2: World, cli: Cli, tmp_path: Path) -> None:
    wheel = _build(world2, cli, tmp_path / "w", "--allow-unlinted")
    prov = json.loads(next(v for k, v in _members(wheel).items() if k.endswith("overlay.json")))
    assert "lint" not in prov
