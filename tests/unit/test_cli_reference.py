"""``docs/reference/cli.md`` ends with the reference :mod:`lazarus.app.cli_reference`
writes from the Typer app: a command or option added without regenerating it fails."""

from __future__ import annotations

from lazarus.app import cli_reference


def test_the_cli_reference_page_is_current() -> None:
    page = cli_reference.PAGE.read_text()
    assert cli_reference.BEGIN in page, "the generated part is missing"
    assert page == cli_reference.page_with_reference(page), (
        "docs/reference/cli.md is stale: python -m lazarus.app.cli_reference --write"
    )


def test_every_command_is_in_the_reference() -> None:
    text = cli_reference.reference()
    for command in ("start", "status", "pause", "resume", "recover", "cancel", "fleet release"):
        assert f"### `lazarus {command}`" in text
