"""Stock vs patched mlx-lm on an Apple-silicon Mac (Metal): serial vs draft model vs MTP, k = 1..3, T = 0 and 0.7.

    scripts/mac_check.sh --model MODEL [--draft-model DRAFT] [--mtp-model MTP_MODEL | --mtp-drafter DRAFTER]
                         [--out FILE.json]

MODEL, DRAFT, MTP_MODEL and DRAFTER are local folders or Hub repo ids. The MTP cases draft with an MTP head: that of
MTP_MODEL (a checkpoint whose own files carry it, e.g. converted with ``mlx_lm.convert --keep-mtp``; defaults to MODEL),
or DRAFTER, a split MTP drafter folder (``model_type`` ``*_mtp``: the mlx-community ``*-MTP-*`` repos, mlx-vlm's
splitters) loaded as MODEL's head (``model_config={"mtp_path": DRAFTER}``, patch 0027). The script

1. builds the patched wheel (``overlay apply mlx-lm``) and two venvs under ``--workdir`` (default
   ``build/mac-check``): ``stock`` (``mlx-lm==<pin>`` from PyPI) and ``patched`` (the wheel), both with ``mlx``
   (Metal); existing venvs are reused;
2. runs scripts/mac_check_worker.py in each: serial decoding, the draft model and (patched only: stock has no MTP
   drafting) the MTP head, for every k and temperature, over the prompts and (T > 0) the seeds;
3. writes one JSON report: per arm and case the decode tok/s (median over runs), acceptance (drafted share of the
   emitted tokens), tokens per verify, the speedup against the same arm's serial decoding and against stock serial,
   and at T = 0 whether the tokens are byte-identical to stock serial decoding.

``--dry-run`` prints the plan (venvs, install commands, cases, preconditions) as JSON and runs nothing;
``--stock-python`` / ``--patched-python`` use existing interpreters instead of building venvs (so the harness also
runs on Linux with ``mlx[cpu]``, as tests/engines/mlx_lm/test_mac_check.py does). Standard library only. Before
anything is installed it checks its preconditions (exit 2, naming what is missing and how to get it): Python >= 3.11
(scripts/mac_check.sh checks it before this file is read), the overlay venv that builds the patched wheel (``--overlay``,
default ``.venv/bin/overlay``) when no ``--patched-python`` is given, and an Apple-silicon Mac when venvs are built.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "scripts" / "mac_check_worker.py"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences why the sky is blue.",
    'Return a JSON object with the keys "name", "age" and "city" for a fictional person.',
]


def _pin() -> str:
    data = tomllib.loads((ROOT / "overlays" / "mlx-lm.toml").read_text())
    return str(data["upstream"]["version"])


def _cases(args: argparse.Namespace, arm: str) -> list[dict[str, Any]]:
    cases = []
    for temp in args.temps:
        cases.append({"id": f"serial/T{temp}", "kind": "serial", "k": 0, "temp": temp})
        if args.mtp_model and args.mtp_model != args.model and not args.no_mtp:
            # The reference of the MTP cases: serial decoding of the MTP model.
            cases.append({"id": f"serial-mtp/T{temp}", "kind": "serial-mtp", "k": 0, "temp": temp})
        for k in args.ks:
            if args.draft_model:
                cases.append({"id": f"draft/k{k}/T{temp}", "kind": "draft", "k": k, "temp": temp})
            if arm == "patched" and not args.no_mtp:
                cases.append({"id": f"mtp/k{k}/T{temp}", "kind": "mtp", "k": k, "temp": temp})
    return cases


def _problems(args: argparse.Namespace) -> list[str]:
    """The preconditions a real run would fail on, each with its fix (empty: none)."""
    out = []
    if not args.patched_python and not Path(args.overlay).is_file():
        out.append(
            f"the overlay venv that builds the patched wheel is missing ({args.overlay}): run "
            "`python3 -m venv .venv && .venv/bin/pip install -e .` in the repository, pass --overlay PATH, or "
            "pass --patched-python"
        )
    return out


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir)
    pin = _pin()
    venvs = {arm: str(work / arm) for arm in ("stock", "patched")}
    install = {
        "stock": [
            [sys.executable, "-m", "venv", venvs["stock"]],
            [f"{venvs['stock']}/bin/pip", "install", "mlx", f"mlx-lm=={pin}"],
        ],
        "patched": [
            [str(args.overlay), "apply", "mlx-lm", "--out", str(work / "wheels"), "--json"],
            [sys.executable, "-m", "venv", venvs["patched"]],
            [f"{venvs['patched']}/bin/pip", "install", "mlx", f"{work / 'wheels'}/mlx_lm-*.whl"],
        ],
    }
    pythons = {"stock": args.stock_python, "patched": args.patched_python}
    return {
        "pin": pin,
        "mac": sys.platform == "darwin" and platform.machine() == "arm64",
        "venvs": venvs,
        "install": {arm: cmds for arm, cmds in install.items() if not pythons[arm]},
        "pythons": {arm: pythons[arm] or f"{venvs[arm]}/bin/python" for arm in venvs},
        "cases": {arm: _cases(args, arm) for arm in venvs},
        "mtp": {"model": args.mtp_model or args.model}
        if not args.mtp_drafter
        else {"drafter": args.mtp_drafter},
        "python": platform.python_version(),
        "problems": _problems(args),
        "out": args.out,
    }


def _build(plan: dict[str, Any]) -> None:
    for arm, cmds in plan["install"].items():
        if Path(plan["pythons"][arm]).exists():
            continue
        for cmd in cmds:
            if any("*" in c for c in cmd):
                pattern = next(c for c in cmd if "*" in c)
                matches = sorted(Path(pattern).parent.glob(Path(pattern).name))
                if not matches:
                    raise SystemExit(
                        f"mac_check: no wheel matches {pattern}; run `overlay apply mlx-lm` first"
                    )
                cmd = [str(matches[-1]) if c == pattern else c for c in cmd]
            print("+", " ".join(cmd), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)


def _run_arm(python: str, payload: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([python, str(WORKER)], input=json.dumps(payload), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"mac_check: the worker failed in {python}:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _summarise(case: dict[str, Any], k: int) -> dict[str, Any]:
    runs = case["runs"]
    emitted = sum(len(r["tokens"]) for r in runs)
    drafted = sum(sum(r["from_draft"]) for r in runs)
    out: dict[str, Any] = {
        "tok_s": statistics.median(r["decode_tps"] for r in runs) if runs else None,
        "runs": len(runs),
        "emitted": emitted,
    }
    if k:
        # Every verify emits its accepted drafts plus one token of its own.
        verifies = max(emitted - drafted, 1)
        out.update(
            drafted_share=drafted / max(emitted, 1),
            acceptance=drafted / (verifies * k),
            tokens_per_verify=emitted / verifies,
        )
    if "error" in case:
        out["error"] = case["error"]
    return out


def report(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": args.model,
        "draft_model": args.draft_model,
        "mtp_model": None if args.mtp_drafter else args.mtp_model or args.model,
        "mtp_drafter": args.mtp_drafter,
        "tokens": args.tokens,
        "ks": args.ks,
        "temps": args.temps,
        "arms": {},
    }
    for arm, res in results.items():
        rows: dict[str, Any] = {}
        for cid, case in res["cases"].items():
            kind, tag = cid.split("/")[0], cid.split("/")[-1]
            temp = float(tag[1:])
            k = 0 if kind.startswith("serial") else int(cid.split("/")[1][1:])
            row = _summarise(case, k)
            serial = (
                "serial-mtp"
                if kind in ("mtp", "serial-mtp") and f"serial-mtp/{tag}" in res["cases"]
                else "serial"
            )
            own = _summarise(res["cases"][f"{serial}/{tag}"], 0)["tok_s"]
            ref = results["stock"]["cases"].get(f"{serial}/{tag}")
            ref_tps = _summarise(ref, 0)["tok_s"] if ref else None
            if row["tok_s"] and own:
                row["vs_own_serial"] = row["tok_s"] / own
            if row["tok_s"] and ref_tps:
                row["vs_stock_serial"] = row["tok_s"] / ref_tps
            if temp == 0 and ref is not None:
                row["identical_to_stock_serial"] = [r["tokens"] for r in case["runs"]] == [
                    r["tokens"] for r in ref["runs"]
                ]
            rows[cid] = row
        doc["arms"][arm] = {
            "mlx_lm": res["mlx_lm"],
            "mlx": res["mlx"],
            "device": res["device"],
            "cases": rows,
        }
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model")
    ap.add_argument("--mtp-model", help="a checkpoint with its MTP head in its own files (default: --model)")
    ap.add_argument(
        "--mtp-drafter",
        help="a split MTP drafter folder or repo (model_type *_mtp), loaded as --model's head",
    )
    ap.add_argument("--no-mtp", action="store_true", help="skip the MTP cases (a model without an MTP head)")
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    ap.add_argument("--temps", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.7])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument(
        "--prompt", action="append", help="a prompt (repeatable; default: three built-in prompts)"
    )
    ap.add_argument("--workdir", default=str(ROOT / "build" / "mac-check"))
    ap.add_argument("--out", default=str(ROOT / "build" / "reports" / "mac-check.json"))
    ap.add_argument("--stock-python", help="an interpreter with stock mlx-lm (no venv is built)")
    ap.add_argument("--patched-python", help="an interpreter with the patched mlx-lm (no venv is built)")
    ap.add_argument(
        "--overlay",
        default=str(ROOT / ".venv" / "bin" / "overlay"),
        help="the overlay command that builds the patched wheel (default: the repository's .venv)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan as JSON; install and run nothing")
    args = ap.parse_args(argv)
    if args.mtp_model and args.mtp_drafter:
        print(
            "mac_check: --mtp-model and --mtp-drafter both name the MTP head; pass one (--mtp-drafter: a split "
            f"*_mtp drafter loaded as the head of --model; got --mtp-model {args.mtp_model} --mtp-drafter "
            f"{args.mtp_drafter})",
            file=sys.stderr,
        )
        return 2
    plan = _plan(args)
    if args.dry_run:
        print(json.dumps(plan, indent=1))
        return 0
    if plan["problems"]:
        for problem in plan["problems"]:
            print(f"mac_check: {problem}", file=sys.stderr)
        return 2
    if plan["install"] and not plan["mac"]:
        print(
            "mac_check: building Metal venvs needs an Apple-silicon Mac (got "
            f"{sys.platform}/{platform.machine()}); pass --stock-python/--patched-python to use existing "
            "interpreters, or --dry-run",
            file=sys.stderr,
        )
        return 2
    _build(plan)
    base = {
        "model": args.model,
        "draft_model": args.draft_model,
        "mtp_model": args.mtp_model or args.model,
        "mtp_drafter": args.mtp_drafter,
        "prompts": args.prompt or PROMPTS,
        "tokens": args.tokens,
        "seeds": args.seeds,
    }
    results = {
        arm: _run_arm(plan["pythons"][arm], {**base, "cases": plan["cases"][arm]})
        for arm in ("stock", "patched")
    }
    doc = report(args, results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    for arm, data in doc["arms"].items():
        for cid, row in data["cases"].items():
            extra = "" if "acceptance" not in row else f" acceptance {row['acceptance']:.2f}"
            same = (
                ""
                if "identical_to_stock_serial" not in row
                else f" identical {row['identical_to_stock_serial']}"
            )
            err = " ERROR" if "error" in row else ""
            tps = "-" if row["tok_s"] is None else f"{row['tok_s']:.1f}"
            print(f"{arm:8s} {cid:14s} {tps:>8s} tok/s{extra}{same}{err}")
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
