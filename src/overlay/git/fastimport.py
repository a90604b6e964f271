"""``git fast-import`` streams: blobs and commits written by one git process, no work tree involved (how rebase and
review build their scratch repositories quickly, with the tool's fixed identity so commit ids are reproducible)."""

from __future__ import annotations

from pathlib import Path

from overlay.git import ops as gitops

BASE_DATE = "Tue, 1 Jan 1980 00:00:00 +0000"  # gitops.TOOL_IDENTITY's date, in fast-import's rfc2822 format


class Stream:
    """A ``git fast-import`` stream: blobs and commits written in one git process, no work tree involved."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.next_mark = 1
        self.blobs: dict[bytes, int] = {}

    def _mark(self) -> int:
        self.next_mark += 1
        return self.next_mark - 1

    def blob(self, data: bytes) -> int:
        if data in self.blobs:
            return self.blobs[data]
        mark = self.blobs[data] = self._mark()
        self.parts += [b"blob\nmark :%d\ndata %d\n" % (mark, len(data)), data, b"\n"]
        return mark

    def commit(
        self,
        ref: str,
        *,
        author: str,
        author_date: str,
        committer: str,
        committer_date: str,
        message: str,
        parent: int | None,
        changes: list[bytes],
    ) -> int:
        mark = self._mark()
        msg = message.encode("utf-8")
        head = (
            f"commit {ref}\nmark :{mark}\nauthor {author} {author_date}\ncommitter {committer} {committer_date}\n"
            f"data {len(msg)}\n"
        ).encode()
        self.parts += [head, msg, b"\n"]
        if parent is not None:
            self.parts.append(b"from :%d\n" % parent)
        self.parts += [*changes, b"\n"]
        return mark

    def ref(self, ref: str, mark: int) -> None:
        self.parts.append(f"reset {ref}\nfrom :{mark}\n\n".encode())


def path_bytes(path: str) -> bytes:
    """A path as fast-import reads it: verbatim, or C-quoted when it starts with a quote or holds a newline."""
    if not (path.startswith('"') or "\n" in path):
        return path.encode("utf-8")
    quoted = path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ('"' + quoted + '"').encode("utf-8")


def whole_tree(stream: Stream, files: dict[str, bytes], executable: set[str] | None = None) -> list[bytes]:
    exe = executable or set()
    return [b"deleteall\n"] + [
        b"M %s :%d %s\n" % (b"100755" if p in exe else b"100644", stream.blob(d), path_bytes(p))
        for p, d in sorted(files.items())
    ]


def tool_ident() -> str:
    t = gitops.TOOL_IDENTITY
    return f"{t['GIT_AUTHOR_NAME']} <{t['GIT_AUTHOR_EMAIL']}>"


def cleaned_message(message: str) -> str:
    """What ``git commit -m`` stores: trailing whitespace stripped from lines, one final newline."""
    lines = [line.rstrip() for line in message.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def run_stream(repo: Path, stream: Stream) -> dict[int, str]:
    marks = repo / ".git" / "overlay-marks"
    gitops.run(
        ["fast-import", "--quiet", "--date-format=rfc2822", f"--export-marks={marks}"],
        cwd=repo,
        input=b"".join(stream.parts) + b"done\n",
    )
    out = {}
    for line in marks.read_text().splitlines():
        mark, sha = line.split()
        out[int(mark[1:])] = sha
    marks.unlink()
    return out


def import_tree(repo: Path, files: dict[str, bytes], message: str) -> str:
    """Commit ``files`` as a root commit with the tool's fixed identity: the commit ``overlay checkout`` makes."""
    stream = Stream()
    mark = stream.commit(
        "refs/overlay/import",
        author=tool_ident(),
        author_date=BASE_DATE,
        committer=tool_ident(),
        committer_date=BASE_DATE,
        message=cleaned_message(message),
        parent=None,
        changes=whole_tree(stream, files),
    )
    return run_stream(repo, stream)[mark]
