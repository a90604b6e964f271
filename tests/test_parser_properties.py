"""Property-based: whatever bytes reach the series/patch parser or the manifest loader, nothing but the tool's own
error (``OverlayError``, which the CLI turns into a documented exit code and a message) escapes (issue 11, class 8).

Inputs start from the real shipped patches, series files and manifests and are mutated (bytes, lines, numbers,
hostile tokens), or are generated outright. Derandomized, so CI sees the same examples every run; the counts keep
the whole file well under a minute on one core.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.core.manifest import load_manifest
from overlay.core.series import parse_patch_bytes, parse_series_file
from overlay.errors import OverlayError

REPO = Path(__file__).resolve().parents[1]
PATCHES = [p.read_bytes() for p in sorted(REPO.glob("patches/*/*.patch"))]
SERIES = [p.read_bytes() for p in sorted(REPO.glob("patches/*/series"))]
MANIFESTS = {p.name: p.read_bytes() for p in sorted(REPO.glob("overlays/*.toml"))}

SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# what breaks parsers: quotes, escapes, encoded words, huge numbers, control bytes, bytes that are not UTF-8,
# and the line starts that switch the parser's state
TOKENS = [
    b'"',
    b"\\",
    b"\\777",
    b"\\9",
    b"\xff",
    b"\xc3",
    b"\x00",
    b"\r",
    b"\t",
    b"\n",
    b" ",
    b"=?x-unknown?q?foo?=",
    b"=?utf-8?b?!!!?=",
    b"=?utf-8?q?=FF?=",
    b"9" * 5000,
    b"-1",
    b"99999999999999999999",
    b"@@ -1,3 +1,3 @@\n",
    b"@@ -0,0 +1 @@\n",
    b"diff --git ",
    b'diff --git "a/x b/x\n',
    b"--- ",
    b"+++ ",
    b"--- /dev/null\n",
    b"---\n",
    b"new file mode 100644\n",
    b"deleted file mode 100644\n",
    b"new mode 120000\n",
    b"old mode 160000\n",
    b"rename from ",
    b"rename to ",
    b"copy from ../x\n",
    b"index \xff..00\n",
    b"GIT binary patch\n",
    b"\\ No newline at end of file\n",
    b"From ",
    b"Subject: ",
    b"a/.git/config",
    b"b/../../x",
    b"# base: ",
    b"[",
    b"]",
    b"[[",
    b"=",
    b"'",
    b'"""',
    b"{",
    b"}",
    b"1979-13-01",
    b"inf",
    b"nan",
    b"0x" + b"f" * 5000,
    b"[" * 2000,
]


def _flip(draw: st.DrawFn, data: bytearray) -> bytearray:
    if data:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return data


def _insert(draw: st.DrawFn, data: bytearray) -> bytearray:
    at = draw(st.integers(0, len(data)))
    piece = draw(st.one_of(st.sampled_from(TOKENS), st.binary(max_size=16)))
    return data[:at] + piece + data[at:]


def _delete(draw: st.DrawFn, data: bytearray) -> bytearray:
    if not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    return data[:at] + data[at + draw(st.integers(1, 64)) :]


def _truncate(draw: st.DrawFn, data: bytearray) -> bytearray:
    return data[: draw(st.integers(0, len(data)))]


def _lines(draw: st.DrawFn, data: bytearray) -> bytearray:
    lines = bytes(data).split(b"\n")
    i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
    op = draw(st.sampled_from(["drop", "dup", "swap", "replace"]))
    if op == "drop":
        del lines[i]
    elif op == "dup":
        lines.insert(j, lines[i])
    elif op == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines[i] = draw(st.sampled_from(TOKENS)).rstrip(b"\n") + draw(st.binary(max_size=8))
    return bytearray(b"\n".join(lines))


_NUMBER = re.compile(rb"\d+")


def _number(draw: st.DrawFn, data: bytearray) -> bytearray:
    """Replace one run of digits (a hunk count, a mode, a version) with another number, or a hostile one."""
    found = list(_NUMBER.finditer(data))
    if not found:
        return data
    m = found[draw(st.integers(0, len(found) - 1))]
    new = draw(
        st.one_of(
            st.sampled_from([b"0", b"-1", b"00", b"9" * 20, b"9" * 5000, b"1e9", b"\xd9\xa3"]),
            st.integers(0, 10**12).map(lambda n: str(n).encode()),
        )
    )
    return data[: m.start()] + new + data[m.end() :]


# structure-aware edits go to the lines that switch the parser's state, at word boundaries
INTERESTING = (
    b"diff --git ",
    b"@@ ",
    b"Subject: ",
    b"From: ",
    b"Date: ",
    b"index ",
    b"--- ",
    b"+++ ",
    b"new file mode ",
    b"deleted file mode ",
    b"rename ",
    b"old mode ",
    b"new mode ",
    b"# base: ",
)
LINE_TOKENS = [
    b'"',
    b"\\",
    b"\\777",
    b"\xff",
    b"=?x-unknown?q?foo?=",
    b"=?utf-8?b?w6kx?=",
    b"9" * 5000,
    b" ",
    b"-",
    b"/",
    b"../",
    b"\t",
    b"\r",
]
HOSTILE_NUMBERS = [b"0", b"-1", b"9" * 20, b"9" * 5000, b"\xd9\xa3", b""]


def _structural(draw: st.DrawFn, data: bytearray) -> bytearray:
    lines = bytes(data).split(b"\n")
    kinds = sorted({k for line in lines for k in INTERESTING if line.startswith(k)})
    if not kinds:
        return data
    kind = draw(st.sampled_from(kinds))
    i = draw(st.sampled_from([n for n, line in enumerate(lines) if line.startswith(kind)]))
    line = lines[i]
    bounds = sorted({0, len(line), *(m.end() for m in re.finditer(rb"[ /:,]", line))})
    at = draw(st.sampled_from(bounds))
    op = draw(st.sampled_from(["insert", "number", "cut"]))
    if op == "insert":
        line = line[:at] + draw(st.sampled_from(LINE_TOKENS)) + line[at:]
    elif op == "number" and (found := list(_NUMBER.finditer(line))):
        m = draw(st.sampled_from(found))
        line = line[: m.start()] + draw(st.sampled_from(HOSTILE_NUMBERS)) + line[m.end() :]
    else:
        line = line[:at]
    lines[i] = line
    return bytearray(b"\n".join(lines))


MUTATIONS: list[Callable[[st.DrawFn, bytearray], bytearray]] = [
    _flip,
    _insert,
    _delete,
    _truncate,
    _lines,
    _number,
    *[_structural] * 6,
]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        data = draw(st.sampled_from(MUTATIONS))(draw, data)
    return bytes(data)


@st.composite
def synthetic_patch(draw: st.DrawFn) -> bytes:
    """A format-patch-shaped text whose pieces are generated: headers, subject, quoted paths, hunk numbers, lines."""
    token = st.sampled_from([t.decode("latin-1") for t in LINE_TOKENS])
    text = st.one_of(
        st.text(max_size=20), st.lists(st.one_of(token, st.text(max_size=4)), max_size=5).map("".join)
    )
    path = st.one_of(st.from_regex(r"[a-z]{1,8}(/[a-z. ]{1,8}){0,2}", fullmatch=True), text)
    a, b = draw(path), draw(path)
    quote = draw(st.sampled_from(["none", "both", "a-open", "b-open", "a-only"]))
    side_a = f'"a/{a}"' if quote in ("both", "a-only") else f'"a/{a}' if quote == "a-open" else f"a/{a}"
    side_b = f'"b/{b}"' if quote == "both" else f'"b/{b}' if quote == "b-open" else f"b/{b}"
    number = st.one_of(
        st.integers(-2, 10**6).map(str), st.sampled_from([n.decode("latin-1") for n in HOSTILE_NUMBERS])
    )
    nums = [draw(number) for _ in range(4)]
    body = draw(st.lists(st.tuples(st.sampled_from([" ", "+", "-", "\\", ""]), text), max_size=8))
    header = draw(
        st.sampled_from(
            [
                "",
                "new file mode 100644\n",
                "deleted file mode 100644\n",
                f"rename from {a}\nrename to {b}\n",
                "old mode 100644\nnew mode 100755\n",
            ]
        )
    )
    lines = [
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001",
        f"From: {draw(text)} <{draw(text)}@example.com>",
        f"Date: {draw(text)}",
        f"Subject: [PATCH] {draw(text)}",
        "",
        draw(text),
        "",
        f"Overlay-Theme: {draw(text)}",
        "---",
        f"diff --git {side_a} {side_b}",
        header + f"index {draw(st.from_regex(r'[0-9a-f]{7}', fullmatch=True))}..abcdef0 100644",
        f"--- {side_a}",
        f"+++ {side_b}",
        f"@@ -{nums[0]},{nums[1]} +{nums[2]},{nums[3]} @@ {draw(text)}",
        *(op + line for op, line in body),
    ]
    return "\n".join(lines).encode("utf-8", "surrogatepass")


def _parse_patch(raw: bytes) -> None:
    with contextlib.suppress(OverlayError):
        parse_patch_bytes(raw, name="0001-fuzz.patch")


@settings(SETTINGS, max_examples=1500)
@given(mutated(PATCHES))
def test_mutated_shipped_patches_raise_only_overlay_errors(raw: bytes) -> None:
    _parse_patch(raw)


@settings(SETTINGS, max_examples=600)
@given(synthetic_patch())
def test_generated_patches_raise_only_overlay_errors(raw: bytes) -> None:
    _parse_patch(raw)


@settings(SETTINGS, max_examples=200)
@given(
    st.one_of(
        st.binary(max_size=512),
        st.text(max_size=256).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=256).map(lambda b: b"From 0 Mon Sep 17 00:00:00 2001\n" + b),
    )
)
def test_random_bytes_as_a_patch_raise_only_overlay_errors(raw: bytes) -> None:
    _parse_patch(raw)


def test_the_seeds_parse() -> None:
    """The unmutated seeds are valid: the mutations start from real inputs, not from garbage."""
    assert len(PATCHES) >= 30 and SERIES and MANIFESTS
    for raw in PATCHES:
        parse_patch_bytes(raw, name="0001-seed.patch")
    with tempfile.TemporaryDirectory() as tmp:
        for data in SERIES:
            parsed = parse_series_file(_write(Path(tmp), "series", data))
            assert parsed.names or parsed.engine == "vllm"  # vllm's series is still empty (issue 20)
        for name, data in MANIFESTS.items():
            assert load_manifest(_write(Path(tmp) / "overlays", name, data)).name == name[: -len(".toml")]


def _write(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


SCRATCH = Path(
    tempfile.mkdtemp(prefix="overlay-properties-")
)  # one folder for every example (no tmp_path per example)


@settings(SETTINGS, max_examples=300)
@given(
    st.one_of(
        mutated(SERIES),
        st.text(max_size=300).map(lambda t: ("# base: demo 1.0 -\n" + t).encode()),
        st.binary(max_size=300),
    )
)
def test_series_files_raise_only_overlay_errors(data: bytes) -> None:
    path = _write(SCRATCH / "series-dir", "series", data)
    with contextlib.suppress(OverlayError):
        parse_series_file(path)


@settings(SETTINGS, max_examples=600)
@given(
    st.one_of(
        st.tuples(st.sampled_from(sorted(MANIFESTS)), mutated(list(MANIFESTS.values()))),
        st.tuples(st.sampled_from(sorted(MANIFESTS)), st.binary(max_size=400)),
        st.tuples(
            st.just("demo.toml"), st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass"))
        ),
    )
)
def test_manifests_raise_only_overlay_errors(case: tuple[str, bytes]) -> None:
    name, data = case
    path = _write(SCRATCH / "root" / "overlays", name, data)
    with contextlib.suppress(OverlayError):
        load_manifest(path)
