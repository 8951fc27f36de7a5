"""The zygote's request check: what it forks, and the reason it gives for what it will not."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.nodes.zygote import Refused, parse_request

PYTHON = os.path.abspath(sys.executable)


def request(tmp_path: Path, argv: list[str], **changes: Any) -> dict[str, Any]:
    return {
        "op": "fork",
        "rank": 0,
        "gen_dir": str(tmp_path),
        "cwd": str(tmp_path),
        "argv": argv,
        "env": {"PATH": os.path.dirname(PYTHON)},
        **changes,
    }


def test_a_script_keeps_its_argv_without_the_interpreter(tmp_path: Path) -> None:
    spec = parse_request(request(tmp_path, [PYTHON, "-u", "train.py", "--x", "1"]), {}, PYTHON)
    assert spec["script"] == "train.py"
    assert spec["argv"] == ["train.py", "--x", "1"]
    assert spec["unbuffered"] is True
    assert spec["orig_argv"][0] == PYTHON


def test_module_and_code_forms(tmp_path: Path) -> None:
    module = parse_request(request(tmp_path, [PYTHON, "-m", "pkg.mod", "a"]), {}, PYTHON)
    assert (module["module"], module["argv"]) == ("pkg.mod", ["-m", "a"])
    code = parse_request(request(tmp_path, [PYTHON, "-cprint(1)"]), {}, PYTHON)
    assert (code["code"], code["argv"]) == ("print(1)", ["-c"])


def test_a_python_name_of_the_same_environment_is_accepted(tmp_path: Path) -> None:
    spec = parse_request(request(tmp_path, ["python3", "x.py"]), {}, PYTHON)
    assert spec["script"] == "x.py"


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["bash", "-c", "true"], "only python commands"),
        (["/opt/other/bin/python", "x.py"], "only python commands"),
        ([PYTHON, "-X", "dev", "x.py"], "option '-X'"),
        ([PYTHON, "-"], "stdin"),
        ([PYTHON, "-u"], "no script"),
        ([PYTHON, "-m"], "needs an argument"),
        ([], "field 'argv'"),
    ],
)
def test_what_is_refused_and_why(tmp_path: Path, argv: list[str], reason: str) -> None:
    with pytest.raises(Refused, match=reason):
        parse_request(request(tmp_path, argv), {}, PYTHON)


def test_bad_fields_are_named(tmp_path: Path) -> None:
    with pytest.raises(Refused, match="field 'rank'"):
        parse_request(request(tmp_path, [PYTHON, "x.py"], rank=True), {}, PYTHON)
    with pytest.raises(Refused, match="field 'cwd'"):
        parse_request(request(tmp_path, [PYTHON, "x.py"], cwd="relative"), {}, PYTHON)
    with pytest.raises(Refused, match="field 'gen_dir'"):
        parse_request(
            request(tmp_path, [PYTHON, "x.py"], gen_dir=str(tmp_path / "missing")), {}, PYTHON
        )


def test_start_up_only_environment_must_match_the_zygotes(tmp_path: Path) -> None:
    req = request(tmp_path, [PYTHON, "x.py"])
    req["env"]["OMP_NUM_THREADS"] = "4"
    with pytest.raises(Refused, match="OMP_NUM_THREADS"):
        parse_request(req, {"OMP_NUM_THREADS": "1"}, PYTHON)
    assert parse_request(req, {"OMP_NUM_THREADS": "4"}, PYTHON)["script"] == "x.py"


def test_a_claimed_rank_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rank-0.zygote.claim").touch()
    with pytest.raises(Refused, match="already claimed"):
        parse_request(request(tmp_path, [PYTHON, "x.py"]), {}, PYTHON)
