"""The `overlay check --endpoints` report's last step (verdict, JSON and HTML files, CheckFailed) and its terminal
lines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from overlay.check import stats
from overlay.errors import CheckFailed
from overlay.fsutil import atomic_write_json, atomic_write_text
from overlay.paths import layout

if TYPE_CHECKING:  # endpoints calls finish(): the options type only, no import at run time
    from overlay.check.endpoints import EndpointOptions


def finish(
    root: Path, options: EndpointOptions, report: dict[str, Any], gates: list[dict[str, Any]]
) -> dict[str, Any]:
    from overlay.check.endpoints_html import render_endpoints
    from overlay.check.host import load_average

    report["host"]["load_average_end"] = load_average()
    for g in gates:
        g["status"] = "pass" if g["passed"] else "fail"
    report["gates"] = gates
    failed = [g for g in gates if not g["passed"]]
    report["verdict"] = "fail" if failed else "pass"
    json_path = options.json_path or layout(root).reports / "endpoints-check.json"
    html_path = options.html_path or layout(root).reports / "endpoints-check.html"
    atomic_write_json(json_path, report)
    atomic_write_text(html_path, render_endpoints(report))
    report["_paths"] = {"json": str(json_path), "html": str(html_path)}
    if failed:
        exc = CheckFailed(
            f"{len(failed)} endpoint gate(s) failed; first: {failed[0]['gate']}: {failed[0]['detail']}",
            tip=f"see {json_path}",
        )
        exc.report = report  # type: ignore[attr-defined]
        raise exc
    return report


def endpoint_lines(report: dict[str, Any]) -> list[str]:
    s = report["servers"]
    lines = [
        (
            f"overlay check --endpoints: {report['verdict'].upper()}  (stock {s['stock']['url']} vs patched "
            f"{s['patched']['url']})"
        )
    ]
    lines += [f"note: {n}" for n in report.get("notes", [])]
    ident = report["identity"]
    lp = ident.get("logprobs")
    lines.append(
        f"identity   {ident['identical_count']}/{ident['prompts']} prompts identical"
        + (f"; logprobs max |d| {lp['max_abs_diff']:.3g} over {lp['positions']} tokens" if lp else "")
    )
    ld = report["load"]
    for arm in ("stock", "patched"):
        a = ld["arms"][arm]
        lines.append(
            f"{arm:<10} {a['requests']} requests ({a['failed']} failed): TTFT p50 {_f(a['ttft_s']['p50'])} s "
            f"p90 {_f(a['ttft_s']['p90'])}; ITL p50 {_f(a['itl_s']['p50'])} s p99 {_f(a['itl_s']['p99'])}; "
            f"tok/s p50 {_f(a['output_tok_s']['p50'])} p90 {_f(a['output_tok_s']['p90'])}"
        )
    for name, r in ld["ratio"].items():
        lines.append(
            f"ratio      {name} patched/stock {stats.fmt_ratio(r)} ({r['better']} is better): {r['verdict']}"
        )
    for g in report["gates"]:
        lines.append(f"gate {'pass' if g['passed'] else 'FAIL'}  {g['gate']}: {g['detail']}")
    paths = report.get("_paths", {})
    if paths:
        lines.append(f"report     {paths.get('json')}  {paths.get('html')}")
    return lines


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
