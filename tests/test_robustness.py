"""No unexpected exit: every failure a user can provoke exits with its documented code, names the offending value and
the next step, and never prints "ERROR unexpected" (issue 11, class 8). Each input is built for real in tmp_path."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from overlay.core.fetch import cached_path
from overlay.core.manifest import load_engine
from rebase_support import add_patches, make_rebase_world
from support import World

OVERLAY = Path(sys.executable).with_name("overlay")  # the console script of the test venv


def assert_explained(r: object, code: int, *needles: str) -> None:
    """Exit ``code``, an ``ERROR`` line naming every needle, and no sign of an unexpected error."""
    err: str = r.err  # type: ignore[attr-defined]
    assert r.code == code, err  # type: ignore[attr-defined]
    assert "ERROR " in err and "unexpected" not in err and "Traceback" not in err, err
    error = err[err.index("ERROR ") :]  # progress lines come before it
    for needle in needles:
        assert needle in error, (needle, err)


def first_patch(world: World) -> Path:
    return sorted(world.series_dir.glob("*.patch"))[0]


def edit_bytes(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data, (old, path)
    path.write_bytes(data.replace(old, new, 1))


# ---------------------------------------------------------------- input files that do not decode or parse


def test_non_utf8_byte_in_a_manifest_comment(world: World, cli: Callable[..., object]) -> None:
    manifest = world.root / "overlays" / "demo.toml"
    manifest.write_bytes(b"# the demo engine, caf\xe9 edition\n" + manifest.read_bytes())
    for argv in (["list"], ["lint", "demo"], ["fetch", "demo"]):
        assert_explained(cli("--root", str(world.root), *argv), 2, "demo.toml:1", "not UTF-8", "0xe9")


def test_manifest_tomllib_cannot_hold(world: World, cli: Callable[..., object]) -> None:
    manifest = world.root / "overlays" / "demo.toml"
    base = manifest.read_text()
    manifest.write_text(base + "\n[runtime]\nx = " + "1" * 5000 + "\n")  # int() digit limit inside tomllib
    assert_explained(cli("--root", str(world.root), "lint", "demo"), 2, "demo.toml", "TOML")
    manifest.write_text(base + "\n[runtime]\nx = " + "[" * 5000 + "\n")  # recursion inside tomllib
    assert_explained(cli("--root", str(world.root), "lint", "demo"), 2, "demo.toml", "TOML")


def test_non_utf8_series_file(world2: World, cli: Callable[..., object]) -> None:
    series = world2.series_dir / "series"
    lines = series.read_bytes().split(b"\n")
    lines.insert(1, b"# reviewed by J\xf6rg")
    series.write_bytes(b"\n".join(lines))
    assert_explained(cli("--root", str(world2.root), "lint", "demo"), 2, "series:2", "not UTF-8")
    assert_explained(cli("--root", str(world2.root), "apply", "demo"), 2, "series:2")


def test_unknown_mime_charset_in_a_subject(world2: World, cli: Callable[..., object]) -> None:
    patch = first_patch(world2)
    edit_bytes(patch, b"Subject: [PATCH] core: shorter greeting", b"Subject: [PATCH] =?x-unknown?q?foo?=")
    assert_explained(
        cli("--root", str(world2.root), "lint", "demo"), 2, patch.name, "Subject", "x-unknown", "TIP "
    )


def test_undecodable_encoded_word_in_from(world2: World, cli: Callable[..., object]) -> None:
    patch = first_patch(world2)
    edit_bytes(patch, b"From: Test Author", b"From: =?utf-8?b?w6kx?= =?utf-8?q?=FF=FE?= Test Author")
    assert_explained(cli("--root", str(world2.root), "lint", "demo"), 2, patch.name, "From")


@pytest.mark.parametrize(
    "header",
    [
        b'diff --git "a/x b/x',
        b'diff --git "a/x\\" b/x',
        b'diff --git a/x "b/x',
        b'diff --git "a/\\9x" "b/\\9x"',
        b'diff --git "a/\\777" "b/\\777"',
    ],
    ids=["open-quote", "escaped-close", "second-side", "bad-octal", "octal-overflow"],
)
def test_broken_quotes_in_a_diff_header(world2: World, cli: Callable[..., object], header: bytes) -> None:
    patch = first_patch(world2)
    edit_bytes(patch, b"diff --git a/python/demo_pkg/core.py b/python/demo_pkg/core.py", header)
    assert_explained(cli("--root", str(world2.root), "lint", "demo"), 2, patch.name)


def test_a_5000_digit_hunk_count(world2: World, cli: Callable[..., object]) -> None:
    patch = first_patch(world2)
    data = patch.read_bytes()
    start = data.index(b"\n@@ -") + 1
    end = data.index(b" @@", start) + 3
    patch.write_bytes(data[:start] + b"@@ -1," + b"9" * 5000 + b" +1 @@" + data[end:])
    assert_explained(cli("--root", str(world2.root), "lint", "demo"), 2, f"{patch.name}:", "9 digits")


def test_a_non_hex_blob_in_an_index_line(world2: World, cli: Callable[..., object]) -> None:
    patch = first_patch(world2)
    data = patch.read_bytes()
    start = data.index(b"\nindex ") + 1
    end = data.index(b" ", start + 6)
    patch.write_bytes(data[:start] + b"index \xff\xfe..abcdef1" + data[end:])
    assert_explained(cli("--root", str(world2.root), "lint", "demo"), 2, "malformed index line")


# ---------------------------------------------------------------- folders where files belong, and back


def test_a_folder_where_a_patch_file_belongs(world2: World, cli: Callable[..., object]) -> None:
    patch = first_patch(world2)
    patch.unlink()
    patch.mkdir()
    (patch / "x").write_text("x")
    for argv in (["lint", "demo"], ["apply", "demo"], ["list"]):
        r = cli("--root", str(world2.root), *argv)
        if argv == ["list"]:  # list reports the broken series in its table and goes on
            assert r.code == 0 and "error:" in r.out and "unexpected" not in r.err  # type: ignore[attr-defined]
        else:
            assert_explained(r, 2, patch.name, "folder")


def test_a_folder_where_a_cached_artifact_belongs(world: World, cli: Callable[..., object]) -> None:
    manifest = load_engine(world.root, "demo")
    slot = cached_path(world.root, manifest.upstream.primary)
    slot.mkdir(parents=True)
    (slot / "junk").write_text("junk")
    for argv in (["fetch", "demo"], ["apply", "demo"]):
        assert_explained(cli("--root", str(world.root), *argv), 2, str(slot), "folder", "rm -r")


def test_out_is_a_file_or_below_one(world: World, cli: Callable[..., object], tmp_path: Path) -> None:
    afile = tmp_path / "wheels.txt"
    afile.write_text("not a folder\n")
    assert_explained(
        cli("--root", str(world.root), "apply", "demo", "--out", str(afile)),
        2,
        str(afile),
        "is a file",
        "TIP pass --out",
    )
    below = afile / "sub"
    assert_explained(
        cli("--root", str(world.root), "apply", "demo", "--out", str(below)),
        2,
        str(below),
        "cannot be created",
    )
    assert afile.read_text() == "not a folder\n"


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a read-only folder anyway"
)
def test_out_is_read_only(world: World, cli: Callable[..., object], tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert_explained(
            cli("--root", str(world.root), "apply", "demo", "--out", str(out)), 2, str(out), "not writable"
        )
    finally:
        out.chmod(0o755)


# ---------------------------------------------------------------- the environment: cwd, pipes, SOURCE_DATE_EPOCH


def run_overlay(*argv: str, stdout: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(OVERLAY), *argv], stdout=stdout, stderr=subprocess.PIPE, timeout=120)


def run_in_deleted_cwd(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """``overlay ARGV`` started in a folder removed just before (the shell cds there, removes it, then execs)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    return subprocess.run(
        ["sh", "-c", script, "sh", str(gone), str(OVERLAY), *argv], capture_output=True, timeout=120
    )


@pytest.mark.parametrize("argv", [("list",), ("--root", "repo", "list")], ids=["no-root", "relative-root"])
def test_deleted_working_directory(world: World, tmp_path: Path, argv: tuple[str, ...]) -> None:
    proc = run_in_deleted_cwd(tmp_path, *argv)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.startswith("ERROR the current directory no longer exists") and "unexpected" not in err
    assert "--root DIR as an absolute path" in err


def test_deleted_working_directory_with_an_absolute_root(world2: World, tmp_path: Path) -> None:
    for argv in (("list",), ("lint", "demo")):
        proc = run_in_deleted_cwd(tmp_path, "--root", str(world2.root), *argv)
        assert proc.returncode == 0, proc.stderr.decode()


@pytest.mark.parametrize("argv", [("list",), ("list", "--json"), ("models", "list", "--json"), ("--help",)])
def test_closed_pipe_exits_quietly(world: World, argv: tuple[str, ...]) -> None:
    """`overlay list | head -0`: the reader is gone before we write; no traceback, no 'unexpected', exit 141."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = run_overlay("--root", str(world.root), *argv, stdout=write_end)
    finally:
        os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode in ((0, 141) if argv == ("--help",) else (141,)), (
        err
    )  # argparse drops a failed help write
    assert err == "", err  # quiet: not even "Exception ignored" at interpreter exit


def test_closed_pipe_after_the_first_line(world: World) -> None:
    """`overlay models list --json | head -1` for real: the reader takes one line and goes away."""
    shell = (
        f'"{OVERLAY}" --root "{world.root}" models list --json | head -1; echo "rc=${{PIPESTATUS[0]}}" >&2'
    )
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, timeout=120)
    err = proc.stderr.decode()
    assert proc.stdout.decode() == "{\n"
    assert err.strip() in ("rc=0", "rc=141"), err  # 0 when the whole output fit the pipe before head left


def wheel_dates(wheel: Path) -> set[tuple[int, ...]]:
    with zipfile.ZipFile(wheel) as zf:
        return {tuple(i.date_time) for i in zf.infolist()}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("-86400", (1980, 1, 1, 0, 0, 0)),
        ("99999999999", (2107, 12, 31, 23, 59, 58)),
        ("9" * 5000, (2107, 12, 31, 23, 59, 58)),
        ("-" + "9" * 40, (1980, 1, 1, 0, 0, 0)),
        ("", (1980, 1, 1, 0, 0, 0)),
    ],
    ids=["negative", "after-2107", "5000-digits", "very-negative", "empty"],
)
def test_source_date_epoch_is_clamped_to_the_zip_range(
    world2: World,
    cli: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    expected: tuple[int, ...],
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    r = cli("--root", str(world2.root), "-q", "apply", "demo")
    assert r.code == 0, r.err  # type: ignore[attr-defined]
    assert wheel_dates(Path(r.out.strip())) == {expected}  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["yesterday", "1.7e9", "0x10", "１２３"])  # noqa: RUF001 (fullwidth digits on purpose)
def test_source_date_epoch_that_is_not_a_number_is_refused(
    world2: World, cli: Callable[..., object], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    assert_explained(
        cli("--root", str(world2.root), "apply", "demo"), 2, f"SOURCE_DATE_EPOCH={value!r}", "TIP "
    )
    assert not (world2.root / "build" / "wheels").exists() or not any(
        (world2.root / "build" / "wheels").rglob("*.whl")
    )


# ---------------------------------------------------------------- releases and urls


def test_rebase_to_a_release_that_does_not_exist(
    tmp_path: Path, cli: Callable[..., object], local_index: Callable[[Path], None]
) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean"])
    manifest = world.root / "overlays" / "demo.toml"
    manifest.write_text(
        "".join(line for line in manifest.read_text().splitlines(True) if not line.startswith("url ="))
    )
    local_index(world.wheel.parent)
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "9.9.9")
    assert_explained(r, 2, "demo-engine 9.9.9", "versions it offers: 1.2.0", "--to")
    assert not (world.root / "build" / "rebase" / "demo" / "state.json").exists()
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "not-a-version")
    assert_explained(r, 2, "'not-a-version' is not a PEP 440 version")


def test_a_pin_the_index_does_not_have(
    world: World, cli: Callable[..., object], tmp_path: Path, local_index: Callable[[Path], None]
) -> None:
    empty = tmp_path / "empty-index"
    empty.mkdir()
    text = "".join(line for line in world.manifest_text().splitlines(True) if not line.startswith("url ="))
    (world.root / "overlays" / "demo.toml").write_text(text)
    local_index(empty)
    assert_explained(
        cli("--root", str(world.root), "fetch", "demo"), 2, "demo-engine==1.2.0", "versions it offers: none"
    )


@pytest.fixture
def bogus_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bytes], str]]:
    """A local TCP server that answers every connection with fixed bytes (an SSH banner, a bare 404, ...)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    servers: list[socket.socket] = []

    def start(answer: bytes) -> str:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        servers.append(srv)

        def serve() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn:
                    conn.settimeout(5)
                    try:
                        conn.recv(65536)
                        conn.sendall(answer)
                    except OSError:
                        pass

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{srv.getsockname()[1]}/demo_engine-1.2.0-py3-none-any.whl"

    yield start
    for srv in servers:
        srv.close()


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "the answer is not HTTP"),
        (b"HTTP/1.0 404 Not Found\r\n\r\n", "404"),
        (b"", "the answer is not HTTP"),
    ],
    ids=["ssh-banner", "http-404", "closed-at-once"],
)
def test_a_url_whose_answer_is_no_release(
    world: World, cli: Callable[..., object], bogus_server: Callable[[bytes], str], answer: bytes, needle: str
) -> None:
    url = bogus_server(answer)
    world.write_manifest(url=url)
    assert_explained(
        cli("--root", str(world.root), "fetch", "demo"), 2, url, needle, "TIP check the artifact's `url`"
    )


def test_urls_that_name_no_file(world: World, cli: Callable[..., object], tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cases = {
        folder.as_uri(): "is a folder",
        (tmp_path / "missing.whl").as_uri(): "No such file",
        "data:application/zip;base64,UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA==": "scheme data:",
        "ftp://example.invalid/x.whl": "scheme ftp:",
        "file://elsewhere.example/x.whl": "a file:// url is local",
        "http://[::1/x.whl": "failed",
    }
    for url, needle in cases.items():
        world.write_manifest(url=url)
        assert_explained(
            cli("--root", str(world.root), "fetch", "demo"), 2, needle, "TIP check the artifact's `url`"
        )


def test_rebase_url_that_is_a_folder(tmp_path: Path, cli: Callable[..., object]) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean"])
    folder = tmp_path / "releases"
    folder.mkdir()
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "1.3.0", "--url", folder.as_uri())
    assert_explained(r, 2, "--url", "is a folder")


def test_the_cache_survives_a_bad_url(world: World, cli: Callable[..., object]) -> None:
    """A sanity check that the refusals above are refusals of the url, not of the world: the real url fetches."""
    assert cli("--root", str(world.root), "fetch", "demo").code == 0  # type: ignore[attr-defined]
    cached = cached_path(world.root, load_engine(world.root, "demo").upstream.primary)
    assert (
        hashlib.sha256(cached.read_bytes()).hexdigest()
        == hashlib.sha256(world.wheel.read_bytes()).hexdigest()
    )
    shutil.rmtree(cached.parent)


@pytest.mark.parametrize("source", ["pypi", "git"])
def test_source_date_epoch_is_checked_before_the_work(
    world2: World, cli: Callable[..., object], monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Refused before fetching or running `python -m build` (which would fail on it with exit 1)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "tomorrow")
    r = cli("--root", str(world2.root), "apply", "demo", "--source", source)
    assert_explained(r, 2, "SOURCE_DATE_EPOCH='tomorrow'")
    assert "fetch:" not in r.err and not (world2.root / "build" / "cache").exists()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "record",
    [
        '{"version": 1, "artifacts": {"wheel:py3-none-any": "x"}}',
        '{"artifacts": [1]}',
        "\xff\xfe",
        '{"version": 1, "artifacts": {"wheel:py3-none-any": {"filename": 3}}}',
    ],
)
def test_a_corrupt_release_record_is_only_a_hint(
    tmp_path: Path, cli: Callable[..., object], record: str
) -> None:
    world = make_rebase_world(tmp_path)
    add_patches(world, ["clean"])
    records = world.root / "build" / "cache" / "releases" / "demo-engine"
    records.mkdir(parents=True)
    (records / "1.3.0.json").write_bytes(record.encode("latin-1"))
    missing = (tmp_path / "demo_engine-1.3.0-py3-none-any.whl").as_uri()
    r = cli("--root", str(world.root), "rebase", "demo", "--to", "1.3.0", "--url", missing)
    assert_explained(r, 2, "--url", "No such file")


# ---------------------------------------------------------------- found while reviewing the hardening


def test_a_file_where_the_build_folder_belongs(world: World, cli: Callable[..., object]) -> None:
    build = world.root / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.write_text("not a folder\n")
    for argv in (["apply", "demo"], ["fetch", "demo"], ["checkout", "demo"]):
        assert_explained(cli("--root", str(world.root), *argv), 2, str(build))
    assert build.read_text() == "not a folder\n"


def test_a_folder_named_like_a_manifest_is_no_engine(world: World, cli: Callable[..., object]) -> None:
    (world.root / "overlays" / "x.toml").mkdir()
    r = cli("--root", str(world.root), "list")
    assert r.code == 0 and "x " not in r.out.replace("\n", " ").split("demo", 1)[0], r.out  # type: ignore[attr-defined]
