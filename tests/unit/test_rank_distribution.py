"""``lazarus-rank`` and the controller agree on one version, the controller needs no
other distribution of this tree (issue 39: ``pip install .`` alone), and the ranks'
PYTHONPATH holds Lazarus's own code only (issue 29). Pure: reads files, starts nothing.
The wheels themselves are built and installed by tests/integration/test_rank_environment.py
and tests/integration/test_packaging.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from activities.nodes import code_root
from activities.nodes.code_root import RANK_HELPER_INSTALL, lazarus_code_root
from activities.nodes.shim_agent import no_warm_answer_reason
from lazarus.domain.version import __version__

REPO = Path(__file__).resolve().parents[2]


def _project(path: str) -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((REPO / path).read_text())["project"]
    return project


def test_both_distributions_have_the_controllers_version_and_no_pin_between_them() -> None:
    """lazarus-train holds lazarus.rank itself: a pin on lazarus-rank would make
    `pip install .` look for it on an index (and install the same files twice)."""
    controller, rank = _project("pyproject.toml"), _project("rank/pyproject.toml")
    assert controller["version"] == rank["version"] == __version__
    assert not any("lazarus-rank" in r for r in controller["dependencies"])  # type: ignore[attr-defined]
    constraints = (REPO / "deploy/docker/worker-constraints.txt").read_text()
    assert "\nlazarus-rank==" not in constraints


def test_the_rank_helper_depends_on_nothing() -> None:
    rank = _project("rank/pyproject.toml")
    assert rank["dependencies"] == []
    assert "optional-dependencies" not in rank


def test_setup_and_dockerfile_install_the_controller_alone() -> None:
    """`make setup` and the image build install lazarus-train only: it holds the rank
    helper, and lazarus-rank beside it would own the same files."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"pip install .* -e '\.\[", makefile), "Makefile"
    assert "./rank" not in makefile
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "rank" not in re.findall(r"^COPY (\S+)", dockerfile, re.MULTILINE)
    assert re.search(r"pip\" install .* \.$", dockerfile, re.MULTILINE), "Dockerfile"
    assert "./rank" not in dockerfile


def test_a_checkout_is_the_ranks_import_root() -> None:
    assert lazarus_code_root() == REPO, "the tests run from a checkout"


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("checkout", True),
        ("site-packages", False),  # an installed controller: never on a rank's path
        ("dist-packages", False),
        ("no-rank-project", False),  # not a checkout of this tree
    ],
)
def test_only_a_checkout_goes_on_the_ranks_path(
    layout: str, expected: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / layout
    (root / "activities").mkdir(parents=True)
    if layout != "no-rank-project":
        (root / "rank").mkdir()
        (root / "rank" / "pyproject.toml").write_text("")
    monkeypatch.setattr(code_root, "ROOT", root)
    assert (lazarus_code_root() == root) is expected


def test_a_warm_start_without_the_helper_says_how_to_install_it() -> None:
    reason = no_warm_answer_reason(["ModuleNotFoundError: No module named 'lazarus'"])
    assert RANK_HELPER_INSTALL in reason
    other = no_warm_answer_reason(
        [
            "python3: Error while finding module specification for 'activities.nodes.warm' "
            "(ModuleNotFoundError: No module named 'activities')"
        ]
    )
    assert "lazarus-train in the job's environment" in other
    assert RANK_HELPER_INSTALL not in other
    assert no_warm_answer_reason([]) == "no answer from the node's warm start (no output)"
