"""Help, docs and the CLI reference are output we test."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.cli.docgen import reference
from overlay.cli.main import command_modules, main

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [m.__name__.rsplit(".", 1)[1].removeprefix("cmd_") for m in command_modules()]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_example_and_a_page(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    mod = next(m for m in command_modules() if m.__name__.endswith(f"cmd_{name}"))
    assert mod.HELP and mod.EXAMPLE.startswith("overlay ")
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert "example: overlay" in out
    page = REPO / "docs" / "commands" / f"{name}.md"
    assert page.is_file(), f"docs/commands/{name}.md is missing"
    text = page.read_text()
    assert text.startswith(f"# overlay {name}") and "Example: `overlay" in text


def test_cli_reference_is_generated_from_the_parser() -> None:
    assert (REPO / "docs" / "cli-reference.md").read_text() == reference(), (
        "docs/cli-reference.md is stale: run `python -m overlay.cli.docgen > docs/cli-reference.md`"
    )


def test_errors_print_error_and_tip_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--root", str(tmp_path), "list"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ERROR --root") and "Traceback" not in err
