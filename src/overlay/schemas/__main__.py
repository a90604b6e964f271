"""``python -m overlay.schemas [--check]``: write (or check) the shipped JSON Schemas from the document types."""

from __future__ import annotations

import sys

from overlay.schemas import DOCUMENTS, path_of, render


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in DOCUMENTS:
        text = render(name)
        path = path_of(name)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.name)
        if not check:
            path.write_text(text, encoding="utf-8")
    if check and stale:
        print(f"stale schemas: {', '.join(stale)} (run `python -m overlay.schemas`)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
