"""Bad specs fail with `file: field: what is wrong`, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazarus.domain.spec import ClassPolicy, JobSpec, SpecError, StrategyName, load_spec

REPO = Path(__file__).resolve().parents[2]
GOOD = """
name: demo
command: [python, train.py]
checkpoint_dir: ckpt
nproc_per_node: 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path, text))
    return caught.value.lines


def test_good_spec_resolves_paths_against_its_folder(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.world_size == 2
    assert spec.checkpoint_dir == str(tmp_path / "ckpt")
    assert spec.run_dir == str(tmp_path / ".lazarus" / "runs")


def test_name_override_lets_one_file_run_twice(tmp_path: Path) -> None:
    assert load_spec(write(tmp_path, GOOD), name_override="demo-2").name == "demo-2"


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ("nproc_per_node: 0", "nproc_per_node: must be at least 1; got 0"),
        ("nproc_per_node: '2'", "nproc_per_node: must be a whole number"),
        ("health: {hang_timeout_s: 0.5}", "health.hang_timeout_s: must be at least 2 (seconds)"),
        ("health: {hang_timout_s: 5}", "health.hang_timout_s: unknown field"),
        ("health: {progress_regex: 'step \\d+'}", "health.progress_regex: needs a capture group"),
        (
            "health: {progress_regex: 'step ('}",
            "health.progress_regex: not a valid regular expression",
        ),
        ("env: {MASTER_PORT: '1'}", "env: MASTER_PORT is set by Lazarus"),
        ("env: {TORCHELASTIC_RUN_ID: x}", "env: TORCHELASTIC_RUN_ID is set by Lazarus"),
        ("env: {ROLE_WORLD_SIZE: '4'}", "env: ROLE_WORLD_SIZE is set by Lazarus"),
        (
            "recovery: {backoff_initial_s: 5, backoff_max_s: 1}",
            "recovery: backoff_max_s must be >= backoff_initial_s",
        ),
        ("nodes: [{name: a}, {name: a}]", "nodes/spares: node names must be unique"),
        ("playbook: {nccl_timeout: {ladder: [reboot]}}", "playbook.nccl_timeout.ladder: unknown"),
        (
            "playbook: {nccl_timeout: {ladder: []}}",
            "playbook.nccl_timeout.ladder: must be at least",
        ),
        ("playbook: {ncc_timeout: {ladder: [escalate]}}", "playbook: unknown failure class"),
        ("straggler: {slowdown_factor: 1.0}", "straggler.slowdown_factor: must be more than"),
        ("on_escalation: []", "on_escalation: must be at least 1 item(s) long; got 0"),
        ("recovery: {backoff_jitter: 2}", "recovery.backoff_jitter: must be at most 1; got 2"),
    ],
)
def test_each_bad_field_is_named(tmp_path: Path, patch: str, expected: str) -> None:
    lines = errors(tmp_path, GOOD + patch + "\n")
    assert any(
        expected.split(":")[0] in line and expected.split(": ", 1)[1][:20] in line for line in lines
    ), lines
    assert all(line.startswith(str(tmp_path / "job.yaml") + ": ") for line in lines)


def test_an_unknown_field_suggests_the_closest_known_one(tmp_path: Path) -> None:
    lines = errors(tmp_path, GOOD + "health: {hang_timout_s: 5}\nnproc_per_nod: 2\n")
    assert any(
        "health.hang_timout_s: unknown field; did you mean 'hang_timeout_s'? (line 6)" in line
        for line in lines
    ), lines
    assert any("nproc_per_nod: unknown field; did you mean 'nproc_per_node'?" in ln for ln in lines)
    [far] = errors(tmp_path, GOOD + "colour: red\n")
    assert "colour: unknown field; check the spelling" in far


def test_an_unknown_field_in_a_list_element_is_matched_against_its_model(
    tmp_path: Path,
) -> None:
    [line] = errors(tmp_path, GOOD + "nodes:\n  - {name: a, launcher: ssh, hots: h1}\n")
    assert "nodes[0].hots: unknown field; did you mean 'host'? (line 7)" in line


def test_a_command_written_as_one_string_says_how_to_write_a_list(tmp_path: Path) -> None:
    text = GOOD.replace("command: [python, train.py]", "command: python train.py --lr 3")
    [line] = errors(tmp_path, text)
    assert line.startswith(f"{tmp_path / 'job.yaml'}: command: must be a list of arguments")
    assert "e.g. [python, train.py]" in line
    assert '[python, train.py, --lr, "3"]' in line and line.endswith("(line 3)")


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ("command: [python, train.py, --steps, 300]", "command[3]: must be text; got the number"),
        ("command: [python, train.py, --amp, yes]", "command[3]: must be text; got true/false"),
        ("nproc_per_node: '2'", "nproc_per_node: must be a whole number; got the text '2'"),
        ("node_timeout_s: 'ten'", "node_timeout_s: must be a number; got the text 'ten'"),
        ("nodes: [{name: a, launcher: sssh}]", "not one of local, ssh, slurm; did you mean 'ssh'?"),
        ("env: [A, B]", "env: must be a mapping (key: value); got a list"),
    ],
)
def test_yaml_traps_get_plain_words(tmp_path: Path, patch: str, expected: str) -> None:
    key = patch.split(":")[0]
    text = "\n".join(ln for ln in GOOD.splitlines() if not ln.startswith(key + ":"))
    lines = errors(tmp_path, text + "\n" + patch + "\n")
    assert any(expected in line for line in lines), lines
    assert not any("Input should be" in line for line in lines), lines
    if "number" in expected and "command" in expected:
        assert any('quote it, e.g. "300"' in line for line in lines), lines


def test_a_bad_job_name_is_explained_in_words(tmp_path: Path) -> None:
    [line] = errors(tmp_path, GOOD.replace("name: demo", "name: Bad Name!"))
    assert "name: 'Bad Name!' is not a job name: use lowercase letters" in line
    assert "pattern" not in line


def test_an_ssh_jobs_workdir_is_checked_on_its_nodes_not_here(tmp_path: Path) -> None:
    """The newcomer review: code that exists only on the nodes was refused, because
    the CLI checked workdir on its own machine. The preflight checks it on each node."""
    text = (
        GOOD + "workdir: /home/train/nowhere-here\nnodes: [{name: h1, launcher: ssh, host: h1}]\n"
    )
    assert load_spec(write(tmp_path, text)).workdir == "/home/train/nowhere-here"
    [line] = errors(tmp_path, GOOD + "workdir: /home/train/nowhere-here\n")
    assert "workdir:" in line and "does not exist" in line


def test_invalid_yaml_names_the_file_not_a_unicode_string(tmp_path: Path) -> None:
    [line] = errors(tmp_path, "name: demo\ncommand: [python, train.py\n")
    assert "<unicode string>" not in line and str(tmp_path / "job.yaml") in line


def test_missing_required_fields_are_all_listed(tmp_path: Path) -> None:
    lines = errors(tmp_path, "name: x\n")
    assert any("command: required field is missing" in line for line in lines)
    # checkpoint_dir is optional: it defaults to checkpoints/{job_id} (per job).
    assert not any("checkpoint_dir" in line for line in lines)


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    [line] = errors(tmp_path, "name: [unclosed\n")
    assert "line" in line and "not valid YAML" in line


def test_not_a_mapping(tmp_path: Path) -> None:
    [line] = errors(tmp_path, "- just\n- a list\n")
    assert "expected a mapping" in line


def test_missing_file_and_workdir(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read the file"):
        load_spec(tmp_path / "absent.yaml")
    [line] = errors(tmp_path, GOOD + "workdir: nowhere\n")
    assert "workdir:" in line and "does not exist" in line


@pytest.mark.parametrize("example", sorted((REPO / "examples" / "jobs").glob("*.yaml")))
def test_shipped_examples_are_valid(example: Path) -> None:
    assert load_spec(example).name


def test_checkpoints_section_defaults_and_resolution(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.checkpoints.durable_uri is None
    assert (spec.checkpoints.keep_local, spec.checkpoints.keep_durable) == (3, 10)
    assert spec.checkpoints.verify_hashes and spec.checkpoints.jit_timeout_s == 60
    local = load_spec(write(tmp_path, GOOD + "checkpoints: {durable_uri: ../durable}\n"))
    assert local.checkpoints.durable_uri == str((tmp_path / ".." / "durable").resolve())
    s3 = load_spec(
        write(
            tmp_path,
            GOOD
            + "checkpoints: {durable_uri: 's3://my-bucket/jobs/demo', keep_local: 0,"
            + " endpoint_url: 'http://127.0.0.1:9000', region: eu-west-1}\n",
        )
    )
    assert s3.checkpoints.durable_uri == "s3://my-bucket/jobs/demo"
    assert s3.checkpoints.durable_is_s3 and s3.checkpoints.keep_local == 0


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            "{durable_uri: 'gs://b/p'}",
            "checkpoints.durable_uri: unsupported scheme 'gs'; use s3://bucket/prefix",
        ),
        ("{durable_uri: 's3://'}", "checkpoints.durable_uri: s3 URI needs a bucket"),
        ("{durable_uri: 's3://Bad_Bucket/p'}", "checkpoints.durable_uri: 'Bad_Bucket' is not"),
        ("{durable_uri: 's3://bkt/a//b'}", "checkpoints.durable_uri: s3 prefix must not"),
        ("{durable_uri: ''}", "checkpoints.durable_uri: must not be empty"),
        ("{endpoint_url: 'http://x:9000'}", "checkpoints: endpoint_url is only used with an s3"),
        (
            "{durable_uri: 's3://bkt/p', endpoint_url: 'http://key:secret@x'}",
            "checkpoints.endpoint_url: must not hold credentials",
        ),
        (
            "{durable_uri: 's3://bkt/p', endpoint_url: 'minio:9000'}",
            "checkpoints.endpoint_url: 'minio:9000' is not an http(s)",
        ),
        ("{keep_local: -1}", "checkpoints.keep_local: must be at least 0; got -1"),
        ("{upload_part_size_mb: 1}", "checkpoints.upload_part_size_mb: must be at least"),
        ("{aws_secret_access_key: x}", "checkpoints.aws_secret_access_key: unknown field"),
    ],
)
def test_bad_checkpoints_section(tmp_path: Path, patch: str, expected: str) -> None:
    lines = errors(tmp_path, GOOD + f"checkpoints: {patch}\n")
    assert any(line.startswith(f"{tmp_path / 'job.yaml'}: {expected}") for line in lines), lines


def test_playbook_overrides_and_hooks_load(tmp_path: Path) -> None:
    spec = load_spec(
        write(
            tmp_path,
            GOOD
            + "playbook:\n  nccl_timeout: {ladder: [restart_in_place, replace_node, escalate], "
            "budget: 4}\n"
            + "on_escalation: [curl, -d, '@-', http://pager.example/hook]\n"
            + "total_steps: 1000\n",
        )
    )
    assert spec.playbook["nccl_timeout"].ladder[-1] == "escalate"
    assert spec.playbook["nccl_timeout"].budget == 4
    assert spec.on_escalation is not None and spec.total_steps == 1000


# --- secrets never go in the spec (issue 10, defect 13) ------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "hf_token",
        "AWS_SESSION_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "CLIENT_SECRET_VALUE",
        "DB_PASSWORD",
        "PGPASSWORD",
        "WANDB_API_KEY",
        "OPENAI_APIKEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SSH_PRIVATE_KEY",
    ],
)
def test_secret_looking_env_names_are_refused_with_the_way_out(tmp_path: Path, name: str) -> None:
    lines = errors(tmp_path, GOOD + f"env: {{{name}: 'v', OMP_NUM_THREADS: '4'}}\n")
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"{tmp_path / 'job.yaml'}: env: {name} looks like a secret")
    assert f"pass_env: [{name}]" in line and "env_from_file" in line and "chmod 600" in line
    assert "'v'" not in line


@pytest.mark.parametrize(
    "name", ["OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES"]
)
def test_ordinary_env_names_are_kept(tmp_path: Path, name: str) -> None:
    spec = load_spec(write(tmp_path, GOOD + f"env: {{{name}: '1'}}\n"))
    assert spec.env == {name: "1"}


def test_pass_env_and_env_from_file_load_and_resolve(tmp_path: Path) -> None:
    text = GOOD + "pass_env: [WANDB_API_KEY, HF_TOKEN]\nenv_from_file: secrets/train.env\n"
    spec = load_spec(write(tmp_path, text))
    assert spec.pass_env == ["WANDB_API_KEY", "HF_TOKEN"]
    assert spec.env_from_file == str(tmp_path / "secrets" / "train.env")
    absolute = load_spec(write(tmp_path, GOOD + "env_from_file: /etc/lazarus/job.env\n"))
    assert absolute.env_from_file == "/etc/lazarus/job.env"
    assert load_spec(write(tmp_path, GOOD)).env_from_file is None


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ("pass_env: [RANK]", "pass_env: RANK is set by Lazarus for every rank"),
        ("pass_env: [LAZARUS_X]", "pass_env: LAZARUS_X is set by Lazarus"),
        ("pass_env: ['A-B']", "pass_env: 'A-B' is not a valid environment variable name"),
        ("pass_env: [HF_TOKEN, HF_TOKEN]", "pass_env: names must be unique; repeated: HF_TOKEN"),
        (
            "pass_env: [NCCL_DEBUG]\nenv: {NCCL_DEBUG: INFO}",
            "job.yaml: pass_env: NCCL_DEBUG is also set in env; keep one of them (line",
        ),
        ("env_from_file: '~/job.env'", "env_from_file: '~' is not expanded"),
        ("env_from_file: ''", "env_from_file: must name a file"),
    ],
)
def test_bad_secret_sources_are_named(tmp_path: Path, patch: str, expected: str) -> None:
    lines = errors(tmp_path, GOOD + patch + "\n")
    assert any(expected in line for line in lines), lines


def test_a_straggler_playbook_is_refused_with_where_to_configure_it(tmp_path: Path) -> None:
    # It was accepted and never read: a ladder for a slow node silently did nothing.
    lines = errors(tmp_path, GOOD + "playbook: {straggler: {ladder: [escalate]}}\n")
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{tmp_path / 'job.yaml'}: playbook.straggler: ")
    assert "straggler.swap" in lines[0]


def test_a_straggler_playbook_is_listed_with_the_other_errors(tmp_path: Path) -> None:
    lines = errors(
        tmp_path, GOOD + "nproc_per_node: 0\nplaybook: {straggler: {ladder: [escalate]}}\n"
    )
    assert any(": playbook.straggler: " in line for line in lines), lines
    assert any(": nproc_per_node: " in line for line in lines), lines


def test_unknown_class_choices_do_not_offer_straggler(tmp_path: Path) -> None:
    [line] = errors(tmp_path, GOOD + "playbook: {ncc_timeout: {ladder: [escalate]}}\n")
    assert "nccl_timeout" in line and "straggler" not in line


def test_jobs_started_with_a_straggler_playbook_still_decode() -> None:
    # The workflow's input of a job started before the refusal must replay.
    spec = JobSpec.model_validate_json(
        '{"name": "old", "command": ["python", "t.py"], "workdir": "/w",'
        ' "playbook": {"straggler": {"ladder": ["replace_node"]}}}'
    )
    assert spec.playbook["straggler"].ladder == [StrategyName.REPLACE_NODE]


def test_ladders_are_strategy_names() -> None:
    policy = ClassPolicy.model_validate({"ladder": ["rollback", "escalate"]})
    assert policy.ladder == [StrategyName.ROLLBACK, StrategyName.ESCALATE]
    assert ClassPolicy.model_validate_json(policy.model_dump_json()) == policy
    assert policy.model_dump(mode="json") == {"ladder": ["rollback", "escalate"], "budget": None}
