"""Task files: the model, the SkyPilot subset, GPU -> instance type, the shipped JSON Schema."""
import json

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.runs import job_summary
from ec2gpu.runs.execute import engine
from ec2gpu.tasks import load, resolve, spec


def test_the_shipped_json_schema_is_the_models():
    assert json.loads(spec.SCHEMA_PATH.read_text()) == spec.json_schema(), \
        "regenerate it: python -m ec2gpu.tasks.spec"


def test_a_skypilot_task_maps_onto_ours_and_names_what_it_drops():
    got = load.parse("name: s\nnum_nodes: 2\nresources:\n  accelerators: {A10G: 4}\n  use_spot: true\n"
                     "  disk_size: 200\n  region: us-west-2\nfile_mounts: {/d: s3://my-bucket}\nservice: {replicas: 2}\n"
                     "secrets: {TOKEN: null}\n"
                     "run: echo\n", "s.yaml")
    t = got.task
    assert got.skypilot and (t.nodes, t.resources.gpu, t.resources.spot, t.resources.disk_gib) == (2, "A10G:4", True, 200)
    assert t.envs == {"TOKEN": None} and t.secrets == ["TOKEN"]
    assert t.resources.region == "us-west-2"  # the run's region (api.run), no longer dropped
    assert got.warnings == ["ignored SkyPilot field(s) ec2gpu does not support: service"]
    assert [(m.target, m.bucket) for m in got.mounts] == [("/d", "my-bucket")]  # file_mounts: read (item 9)


def test_our_own_format_is_not_taken_for_skypilot_and_envs_values_are_the_text_skypilot_makes():
    got = load.parse("run: echo\nenvs: {EPOCHS: 3, FLAG: true, LR: 1.0, USE_BF16: false, FROM_HERE: null}\n", "t.yaml")
    assert not got.skypilot  # the same rule in both formats: Python's str(), as sky/task.py applies it
    assert got.task.envs == {"EPOCHS": "3", "FLAG": "True", "LR": "1.0", "USE_BF16": "False", "FROM_HERE": None}


def test_a_gpu_picks_the_cheapest_type_with_exactly_that_many():
    assert resolve.instance_type_for_gpu("T4") == "g4dn.xlarge"
    assert resolve.instance_type_for_gpu("A10G:4") == "g5.12xlarge"
    assert resolve.instance_type_for_gpu("l4:8") == "g6.48xlarge"
    assert resolve.instance_type_for_gpu("H100:1") == "p5.4xlarge"
    with pytest.raises(UsageError, match="no EC2 instance type has exactly 16 x H100") as exc:
        resolve.instance_type_for_gpu("H100:16")
    assert "with 2 nodes" in exc.value.hint


def test_durations_and_empty_instance_types():
    assert spec.minutes("2h") == 120 and spec.minutes(90) == 90 and spec.minutes("45s") == 0.75
    with pytest.raises(UsageError, match="resources.instance_type: .*empty"):
        load.parse("run: x\nresources: {instance_type: [g5.xlarge, '']}\n", "t.yaml")


def test_a_null_env_comes_from_this_machine_or_is_refused_by_name():
    task = load.parse("run: x\nenvs: {A: '1', B: null}\n", "t.yaml").task
    assert load.env_values(task, {"B": "2"}) == {"A": "1", "B": "2"}
    with pytest.raises(UsageError, match="envs: B is null"):
        load.env_values(task, {})


def test_the_job_environment_has_ours_and_skypilots_names(tmp_path):
    task = load.parse("name: t\nworkdir: null\nrun: x\nenvs: {A: '1'}\ncheckpoint_dir: ckpt\n", "t.yaml", tmp_path)
    job = engine.prepare(task, {})
    env = engine.node_env(job, "r1", "/home/u/ec2gpu/runs/r1", 1, ["10.0.0.1", "10.0.0.2"], 4, resume=True)
    assert env["A"] == "1" and env["EC2GPU_RESUME"] == "1" and env["EC2GPU_NODE_RANK"] == env["SKYPILOT_NODE_RANK"] == "1"
    assert env["EC2GPU_HEAD_IP"] == "10.0.0.1" and env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2"
    assert env["EC2GPU_CHECKPOINT_DIR"] == "/home/u/ec2gpu/workdirs/t/ckpt"
    assert env["EC2GPU_OUTPUT_DIR"] == "/home/u/ec2gpu/runs/r1/out" and env["SKYPILOT_NUM_GPUS_PER_NODE"] == "4"


def test_secret_values_are_masked(tmp_path):
    task = load.parse("run: x\nworkdir: null\nenvs: {T: null}\nsecrets: [T]\n", "t.yaml", tmp_path)
    job = engine.prepare(task, {"T": "abc123"})
    assert job_summary.mask_text("token=abc123!", job.secret_values) == "token=****!"


# --- a hostile task file or flag: what it may send, how big and deep it may be, which names it may export ---

@pytest.fixture
def said(monkeypatch, tmp_path):
    """The CLI's stderr (cli/render.err, a StringIO); EC2GPU_HOME is tmp_path/state, which a refusal never creates."""
    import io

    from rich.console import Console

    from ec2gpu.cli import render
    buf = io.StringIO()
    monkeypatch.setattr(render, "err", Console(file=buf, width=400))
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "state"))
    return buf


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home directory ($HOME) with ~/.aws/credentials, ~/.config/gcloud and a project, ~/proj."""
    home = tmp_path / "home"
    for rel in (".aws/credentials", ".config/gcloud/credentials.db", ".netrc", "proj/train.py", "other/x.py"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("secret")
    monkeypatch.setenv("HOME", str(home))
    return home


def _file(directory, text: str, name: str = "task.yaml") -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("workdir, why", [("..", "is your home directory"), ("../.aws", "is inside .*/.aws"),
                                          ("../.config", "holds .*/.config/gcloud"), ("/", "holding your home"),
                                          ("../..", "holding your home")])
def test_a_workdir_that_is_or_holds_the_home_or_a_credentials_directory_is_refused_even_with_the_flag(home, workdir,
                                                                                                    why):
    path = _file(home / "proj", f"name: t\nworkdir: {workdir}\nrun: x\n")
    with pytest.raises(UsageError, match=f"task.yaml:2: workdir: .*{why}.*refused") as exc:
        load.load(path, allow_outside=True)
    assert "credentials" in exc.value.hint


def test_a_workdir_outside_the_task_files_directory_needs_workdir_outside(home, said, tmp_path):
    from ec2gpu import cli
    path = _file(home / "proj", "name: t\nworkdir: ../other\nrun: x\n")
    with pytest.raises(UsageError, match=f"task.yaml:2: workdir: {home / 'other'} is outside {home / 'proj'}") as exc:
        load.load(path)
    assert "--workdir-outside" in exc.value.hint
    assert load.load(path, allow_outside=True).workdir == home / "other"
    (home / "proj" / "link").symlink_to(home / "other")  # a link inside that leads outside is outside
    with pytest.raises(UsageError, match="is outside"):
        load.load(_file(home / "proj", "name: t\nworkdir: link\nrun: x\n", "link.yaml"))
    assert load.load(_file(home / "proj", "name: t\nworkdir: .\nrun: x\n", "here.yaml")).workdir == home / "proj"
    for argv in (["run", "--sandbox", path], ["exec", "dev", "--sandbox", path], ["image", "bake", "--sandbox", path]):
        assert cli.main(argv) == 2, argv
    assert "--workdir-outside" in said.getvalue() and not (tmp_path / "state").exists()


def test_a_command_run_from_the_home_directory_is_refused_with_a_hint_to_cd_into_the_project(home, said, tmp_path,
                                                                                           monkeypatch):
    from ec2gpu import cli
    monkeypatch.chdir(home)
    assert cli.main(["run", "--sandbox", "--expect", "1m", "--", "true"]) == 2
    assert cli.main(["run", "--sandbox", "--expect", "1m", "--workdir", str(home / ".aws"), "--", "true"]) == 2
    shown = said.getvalue()
    assert "the current directory (a command's workdir): " in shown and "is your home directory" in shown
    assert "--workdir: " in shown and "cd into your project's directory" in shown
    assert "Traceback" not in shown and not (tmp_path / "state").exists()


@pytest.mark.parametrize("value", ["/", "/etc", "..", "../x", "a/../../b", "''", ".", "./", "~/x"])
def test_checkpoint_dir_must_stay_inside_the_workdir(tmp_path, value):
    with pytest.raises(UsageError, match=r"t\.yaml:3: checkpoint_dir: "):
        load.parse(f"name: t\nworkdir: null\ncheckpoint_dir: {value}\nrun: x\n", "t.yaml", tmp_path)


def test_outputs_globs_must_stay_inside_the_output_dir_and_good_paths_load(tmp_path):
    for bad in ("/etc/*", "../*", "a/../../x", "!/x"):
        with pytest.raises(UsageError, match=r"t\.yaml:3: outputs: .*(absolute|'\.\.')"):
            load.parse(f"name: t\nworkdir: null\noutputs: ['{bad}']\nrun: x\n", "t.yaml", tmp_path)
    task = load.parse("name: t\nworkdir: null\noutputs: ['*.json', '!tmp/*', 'sub/**']\ncheckpoint_dir: ck/a\n"
                      "run: x\n", "t.yaml", tmp_path).task
    assert task.checkpoint_dir == "ck/a" and task.outputs == ["*.json", "!tmp/*", "sub/**"]


BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)) + "run: x\n"


def test_yaml_bombs_are_refused_with_a_line(tmp_path):
    assert len(BILLION_LAUGHS) < 1024
    with pytest.raises(UsageError, match=r"t\.yaml:\d+: refused: more than 100,000 values once its aliases"):
        load.parse(BILLION_LAUGHS, "t.yaml", tmp_path)
    many = "x: &x 1\nl: [" + ",".join(["*x"] * 101) + "]\nrun: x\n"
    with pytest.raises(UsageError, match=r"t\.yaml:2: refused: more than 100 aliases"):
        load.parse(many, "t.yaml", tmp_path)
    with pytest.raises(UsageError, match=r"t\.yaml:1: refused: the alias \*a is inside its own anchor"):
        load.parse("a: &a [*a]\nrun: x\n", "t.yaml", tmp_path)
    deep = "".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v\n"
    with pytest.raises(UsageError, match=r"t\.yaml:6\d: refused: nested deeper than 64 levels"):
        load.parse(deep, "t.yaml", tmp_path)


def test_an_error_in_a_list_item_names_that_items_own_line(tmp_path):
    """A list item has no key: its line is where the item starts (load._lines), in both formats,
    whatever blank lines or comments come before it."""
    sky = "resources:\n  any_of:\n    - accelerators: T4:1\n\n    - 42\nrun: x\n"
    with pytest.raises(UsageError, match=r"^t\.yaml:5: resources\.any_of\[1\]: 42: a candidate is a mapping"):
        load.parse(sky, "t.yaml", tmp_path)
    ours = "workdir: null\nresources:\n  any_of:\n    - gpu: T4\n    # a comment\n    - 42\nrun: x\n"
    with pytest.raises(UsageError, match=r"^t\.yaml:6: resources\.any_of\.1: "):
        load.parse(ours, "t.yaml", tmp_path)


def test_a_20000_deep_task_file_is_a_usage_error_through_the_cli(said, tmp_path):
    from ec2gpu import cli
    assert cli.main(["run", _file(tmp_path, "run: x\nl: " + "[" * 20000 + "]" * 20000 + "\n")]) == 2
    assert cli.main(["run", _file(tmp_path, "run: x\nl: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n")]) == 2
    shown = said.getvalue()
    assert shown.count("task.yaml:2: refused: nested deeper than 64 levels") == 2 and "Traceback" not in shown


def test_a_5000_digit_number_is_refused_at_its_line_through_the_cli(said, tmp_path):
    """Python refuses to read an integer of over 4,300 digits (ValueError): a task file's is a
    FILE:LINE refusal, exit 2, not `error: ValueError`, exit 1 (issue 44.7)."""
    from ec2gpu import cli
    assert cli.main(["run", _file(tmp_path, "run: x\nenvs:\n  A: " + "9" * 5000 + "\n")]) == 2
    assert cli.main(["run", _file(tmp_path, "run: x\nresources:\n  disk_size: " + "9" * 5000 + "\n")]) == 2
    shown = said.getvalue()
    assert shown.count("task.yaml:3: refused: a number of 5,000 characters") == 2
    assert "ValueError" not in shown and "Traceback" not in shown
    assert load.parse("run: x\nenvs:\n  A: '" + "9" * 5000 + "'\n", "t.yaml", tmp_path).task.envs["A"] == "9" * 5000


def test_a_task_file_over_1_mib_is_refused_before_it_is_read_whole(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("run: x\n" + "# pad\n" * (load.MAX_TASK_BYTES // 6 + 1))
    with pytest.raises(UsageError, match=r"big\.yaml:1: refused: a task file holds at most 1024 KiB"):
        load.load(path)
    with pytest.raises(UsageError, match="at most 1024 KiB"):
        load.parse(path.read_text(), "t.yaml", tmp_path)
    with pytest.raises(UsageError, match="at most 1024 KiB"):  # counted in UTF-8 bytes, not characters
        load.parse("run: x\n# " + "é" * (load.MAX_TASK_BYTES // 2) + "\n", "t.yaml", tmp_path)


def test_a_task_file_with_a_few_anchors_and_a_merge_key_still_loads(tmp_path):
    text = "name: t\nworkdir: null\nsecrets: &s {TOKEN: abc}\nenvs: {<<: *s, C: 3}\nsetup: &cmd echo hi\nrun: *cmd\n"
    got = load.parse(text, "t.yaml", tmp_path).task
    assert got.envs == {"TOKEN": "abc", "C": "3"} and got.secrets == ["TOKEN"] and got.setup == got.run == "echo hi"
    with pytest.raises(UsageError, match=r"t\.yaml:3: envs: '1A' is not an environment variable name"):
        load.parse("run: x\nsetup: &b x\nenvs: {1A: *b}\n", "t.yaml", tmp_path)


@pytest.mark.parametrize("flags", [["--env", "X;touch /tmp/pwned;Y=1"], ["--env", "A\n=1"], ["--secret", "T B"],
                                   ["-e", "1A=2"]])
def test_env_names_from_flags_are_checked_like_the_task_files_before_anything_starts(said, tmp_path, monkeypatch,
                                                                                    flags):
    from ec2gpu import cli
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--sandbox", "--expect", "1m", *flags, "--", "true"]) == 2
    assert cli.main(["exec", "dev", "--sandbox", *flags, "--", "true"]) == 2
    shown = said.getvalue()
    assert shown.count("not an environment variable name") == 2 and "Traceback" not in shown
    assert not (tmp_path / "state").exists()


def test_every_export_line_checks_its_names_and_quotes_its_values(tmp_path):
    import subprocess
    import sys

    from ec2gpu.remote import jobs
    loaded = load.parse("name: t\nworkdir: null\nrun: x\n", "t.yaml", tmp_path)
    with pytest.raises(UsageError, match="env 'X;touch y;Y': not an environment variable name"):
        engine.prepare(loaded, {}, extra_env={"X;touch y;Y": "1"})  # the Python API's env= and secrets=
    with pytest.raises(ValueError, match="not an environment variable name"):
        jobs.job_script("/r", ["true"], {"A=$(touch y)": "1"})
    env = tmp_path / "job.env.json"
    env.write_text(json.dumps({"A": "$(touch pwned) 'x'"}))
    done = subprocess.run([sys.executable, "-c", engine._EXPORTS, str(env)], capture_output=True, text=True)
    subprocess.run(["bash", "-c", done.stdout + ' test "$A" = "$(printf %s "\\$(touch pwned) \'x\'")"'], check=True,
                   cwd=tmp_path)
    assert not (tmp_path / "pwned").exists()
    env.write_text(json.dumps({"X;touch pwned;Y": "1"}))
    done = subprocess.run([sys.executable, "-c", engine._EXPORTS, str(env)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "" and "not an environment variable name" in done.stderr


def test_a_misspelt_field_is_named_unknown_with_the_field_it_may_be_rather_than_the_one_missing():
    """`runn:` for `run:` (issue 48 item 12): the unknown field, at its line, with "did you mean run?",
    not "run: missing", which pydantic lists first."""
    with pytest.raises(UsageError) as exc:
        load.parse("name: x\nrunn: echo hi\n", "task.yaml")
    assert exc.value.message == "task.yaml:2: runn: unknown field"
    assert exc.value.hint.startswith("did you mean run?")


@pytest.mark.parametrize("text, says", [
    ('name: "bad name!"\nrun: x\n',
     "task.yaml:1: name: 'bad name!': should be letters, digits, `.`, `_` and `-`, starting with a letter or a digit"),
    ("name: x\nrun: [1, 2]\n", "task.yaml:2: run: [1, 2]: should be text"),
    ("name: x\nrun: x\nresources: 3\n", "task.yaml:3: resources: 3: should be a mapping (key: value lines)"),
    ("name: x\nrun: x\nresources:\n  spot: maybe\n", "task.yaml:4: resources.spot: 'maybe': should be true or false"),
    ("name: x\nrun: x\narray: 3\nmax_workers: 0\n", "task.yaml:4: max_workers: 0: should be a number of at least 1"),
    ("name: x\nrun: x\nnodes: two\n", "task.yaml:3: nodes: 'two': should be a whole number"),
])
def test_a_field_of_the_wrong_kind_is_refused_in_the_task_writers_words(text, says):
    """Every refusal names the value and what the field takes, never a regular expression or
    pydantic's own phrasing ("String should match pattern '^[A-Za-z0-9]...'", "Input should be")."""
    with pytest.raises(UsageError) as exc:
        load.parse(text, "task.yaml")
    assert exc.value.message.startswith(says)
    assert "Input should" not in exc.value.message and "pattern" not in exc.value.message
    assert "^" not in exc.value.message
