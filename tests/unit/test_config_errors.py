"""A bad job spec or fleet config gets lines a person can act on (issue 37, item 5).

From the newcomer review: ``command: [torchrun, ...]`` was accepted silently; an
unquoted ``ten`` was told to "remove the quotes"; ``-5`` got pydantic's wording without
the value; a missing workdir had no line; the suggested rewrite of a one-string command
did not parse as written; fleet configs failed with raw pydantic text and exit 1.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lazarus.app import cli
from lazarus.domain.config_errors import flow_list
from lazarus.domain.spec import SpecError, load_spec

GOOD = """\
name: tiny
workdir: .
command: [python, train.py]
nproc_per_node: 2
health:
  progress_regex: '^step (?P<step>\\d+)'
"""


def _lines(tmp_path: Path, text: str, name: str | None = None) -> list[str]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path, name_override=name)
    return caught.value.lines


def _suggested(line: str, after: str) -> object:
    """The YAML a line suggests (from ``after`` to the next ';' outside brackets)."""
    tail = line.split(after, 1)[1]
    match = re.match(r"\[[^\]]*\]", tail)
    assert match is not None, line
    return yaml.safe_load(match.group(0))


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ('[torchrun, --nproc_per_node, "2", train.py, --steps, "60"]', ["python", "train.py"]),
        (
            '[torchrun, "--nproc-per-node=4", --max_restarts, "3", --master_port, "29500", '
            "-m, pkg.train, --lr, 1e-3]",
            ["python", "-m", "pkg.train"],
        ),
        ("[python, -m, torch.distributed.run, --standalone, train.py]", ["python", "train.py"]),
        ("[/opt/venv/bin/torchrun, train.py, 'on']", ["python", "train.py"]),
    ],
)
def test_a_torchrun_command_is_refused_with_the_spec_that_replaces_it(
    tmp_path: Path, command: str, program: list[str]
) -> None:
    [line] = _lines(tmp_path, GOOD.replace("[python, train.py]", command))
    assert line.startswith(f"{tmp_path / 'job.yaml'}: command: runs torchrun")
    assert "Lazarus is the launcher" in line and line.endswith("(line 3)")
    fixed = _suggested(line, "drop torchrun and write command: ")
    assert isinstance(fixed, list) and all(isinstance(arg, str) for arg in fixed), fixed
    assert fixed[: len(program)] == program
    if "--nproc-per-node=4" in command:
        assert "nproc_per_node: 4" in line and "recovery.max_restarts: 3" in line
        assert "--master_port: set by Lazarus" in line
        assert fixed[-2:] == ["--lr", "1e-3"]


def test_type_errors_suggest_removing_quotes_only_when_there_were_any(tmp_path: Path) -> None:
    word = _lines(tmp_path, GOOD + "node_timeout_s: ten\n")
    assert "must be a number; got the text 'ten'" in word[0]
    assert "quotes" not in word[0]
    quoted = _lines(tmp_path, GOOD.replace("nproc_per_node: 2", 'nproc_per_node: "2"'))
    assert "must be a whole number; got the text '2'; remove the quotes" in quoted[0]


def test_bounds_say_what_was_given(tmp_path: Path) -> None:
    [line] = _lines(tmp_path, GOOD + "  hang_timeout_s: -5\n")
    assert "health.hang_timeout_s: must be at least 2 (seconds); got -5 (line 7)" in line


def test_every_error_of_the_review_carries_its_line(tmp_path: Path) -> None:
    cases = [
        GOOD + "  hang_timout_s: 10\n",
        GOOD + "  hang_timeout_s: ten\n",
        GOOD + "  hang_timeout_s: -5\n",
        GOOD.replace("workdir: .", "workdir: no/such/dir"),
        GOOD.replace("[python, train.py]", "python train.py --steps 60"),
        GOOD + "nodes: [{name: a}, {name: a}]\n",
        GOOD + "pass_env: [NCCL_DEBUG]\nenv: {NCCL_DEBUG: INFO}\n",
    ]
    for text in cases:
        for line in _lines(tmp_path, text):
            assert re.search(r" \(line \d+\)$", line), line


def test_the_one_string_command_fix_parses_as_it_stands(tmp_path: Path) -> None:
    text = GOOD.replace("[python, train.py]", "python train.py --steps 60 --amp on --tag 'a b'")
    [line] = _lines(tmp_path, text)
    fixed = _suggested(line, "write it as ")
    assert fixed == ["python", "train.py", "--steps", "60", "--amp", "on", "--tag", "a b"]
    (tmp_path / "fixed.yaml").write_text(GOOD.replace("[python, train.py]", flow_list(fixed)))
    assert load_spec(tmp_path / "fixed.yaml").command == fixed


def test_flow_lists_read_back_as_the_same_strings() -> None:
    rng = random.Random(5)
    alphabet = "ab01 .,:#-[]{}'\"!&*?|>%@`~\\\té"
    specials = ["", "60", "1e-3", "on", "no", "null", "~", "-", "- x", "#x", "a: b", "0x1F"]
    for _ in range(300):
        items = [
            rng.choice(specials) if rng.random() < 0.3 else "".join(rng.choices(alphabet, k=5))
            for _ in range(rng.randrange(1, 6))
        ]
        assert yaml.safe_load(flow_list(items)) == items, flow_list(items)


def test_a_bad_name_override_is_blamed_on_the_option(tmp_path: Path) -> None:
    [line] = _lines(tmp_path, GOOD, name="Bad Name")
    assert line.startswith("--name: 'Bad Name' is not a job name")


def test_an_empty_spec_says_so_in_words(tmp_path: Path) -> None:
    [line] = _lines(tmp_path, "")
    assert line.endswith("(top level): expected a mapping of fields; the file is empty")


FLEET_BAD = """\
name: rack1
nodez: [{name: a}]
lemon: {max_incidents: -1}
"""


def test_fleet_config_errors_are_worded_like_spec_errors_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(FLEET_BAD)
    result = CliRunner().invoke(cli.app, ["fleet", "start", str(config)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert f"{config}: nodez: unknown field; did you mean 'nodes'? (line 2)" in lines
    assert f"{config}: nodes: required field is missing" in lines
    assert (
        f"{config}: lemon.max_incidents: unknown field; did you mean 'incidents'? (line 3)" in lines
    )
    assert all("Input should" not in line and "Extra inputs" not in line for line in lines)
    assert "Traceback" not in result.output
