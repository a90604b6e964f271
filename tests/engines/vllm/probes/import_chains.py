"""Which vLLM modules pull in which packages at start-up: run with a vLLM arm's interpreter (docs/engines/vllm.md).

    ARM/bin/python tests/engines/vllm/probes/import_chains.py STATEMENT [PREFIX ...]

Runs ``python -X importtime -c STATEMENT`` in a fresh interpreter of the same arm and reads its import tree. For each
PREFIX (a package such as ``openai`` or ``vllm.entrypoints.openai``) it prints how many modules of it were imported,
their self time, and every chain from a root import down to the first module of the package on that branch, with the
cumulative time and the number of modules imported below that first module (itself included). Without a PREFIX it
prints the 25 packages (first two name parts) with the most modules. OVERLAY_FULL_CHAINS=1 prints whole chains.
Measures only; changes nothing of vLLM. Test infrastructure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

FULL = os.environ.get("OVERLAY_FULL_CHAINS") == "1"  # print whole chains, not the first two and last five


@dataclass(frozen=True)
class Node:
    name: str
    self_us: int
    cumulative_us: int
    depth: int
    chain: tuple[str, ...]


def parse(stderr: str) -> list[Node]:
    """The ``-X importtime`` lines, each with the chain of modules that imported it (outermost first).

    Lines come in post-order (a module after the modules it imported), so a module's chain is known only once its
    ancestors' lines arrive: read the lines backwards, where every module comes before its children."""
    rows: list[tuple[int, int, str]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        head, cumulative, raw_name = line.split("|", 2)
        rows.append((int(head.split(":", 1)[1]), int(cumulative), raw_name[1:]))
    nodes: list[Node] = []
    stack: list[tuple[int, str]] = []
    for self_us, cumulative_us, raw in reversed(rows):
        depth = (len(raw) - len(raw.lstrip(" "))) // 2
        name = raw.strip()
        while stack and stack[-1][0] >= depth:
            stack.pop()
        nodes.append(Node(name, self_us, cumulative_us, depth, tuple(n for _, n in stack)))
        stack.append((depth, name))
    return nodes


def in_package(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def report(nodes: list[Node], prefix: str) -> list[str]:
    members = [n for n in nodes if in_package(n.name, prefix)]
    heads = [n for n in members if not any(in_package(a, prefix) for a in n.chain)]
    self_s = sum(n.self_us for n in members) / 1e6
    lines = [f"{prefix}: {len(members)} modules, self {self_s:.2f} s, {len(heads)} entry points"]
    for head in sorted(heads, key=lambda n: -n.cumulative_us):
        below = 1 + sum(1 for n in nodes if head.name in n.chain)
        chain = (*head.chain, head.name)
        shown = " -> ".join(chain if len(chain) <= 7 or FULL else (*chain[:2], "...", *chain[-5:]))
        lines.append(f"  {head.cumulative_us / 1e6:6.2f} s {below:5d} modules  {shown}")
    return lines


def main() -> None:
    statement, prefixes = sys.argv[1], sys.argv[2:]
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        sys.exit(f"{statement!r} failed:\n{run.stderr[-4000:]}")
    nodes = parse(run.stderr)
    print(f"{statement}: {len(nodes)} modules")
    if not prefixes:
        counts = Counter(".".join(n.name.split(".")[:2]) for n in nodes)
        for package, count in counts.most_common(25):
            print(f"  {count:5d}  {package}")
    for prefix in prefixes:
        print("\n".join(report(nodes, prefix)))


if __name__ == "__main__":
    main()
