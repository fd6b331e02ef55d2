"""uv and conda for the tasks that call them, as SkyPilot's images have them (tasks/tools.py, issue 51
item 9): which tasks get them, the setup steps that install them (run here with stand-ins for the
network: Miniforge is not reachable from here), the plan's line, and SkyPilot's default disk."""
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from ec2gpu import cli
from ec2gpu.tasks import load, skypilot, tools
from ec2gpu.tasks.spec import Task


def test_a_task_that_calls_uv_or_conda_gets_them_installed_before_its_own_setup():
    loaded = load.parse("name: t\nresources: {accelerators: T4}\nsetup: uv pip install -r req.txt\n"
                        "run: conda run -n base python x.py\n")
    assert loaded.tools == ("uv", "conda")
    assert loaded.task.setup == tools.install_lines(("uv", "conda")) + "uv pip install -r req.txt"
    assert tools.own_setup(loaded.task.setup, loaded.tools) == "uv pip install -r req.txt"
    # a command, or a Task made in Python, the same way; no setup of its own: the install lines alone
    command = load.LoadedTask(Task(name="c", run="uv run train.py"), None, None)
    assert command.tools == ("uv",) and command.task.setup == tools.install_lines(("uv",))
    again = load.LoadedTask(command.task, None, None)  # applied twice, the same
    assert again.task.setup == command.task.setup and again.tools == ("uv",)
    plain = load.parse("name: p\nsetup: pip install -r req.txt\nrun: /opt/conda/bin/python x.py --lock uv.lock\n")
    assert plain.tools == () and plain.task.setup == "pip install -r req.txt"


@pytest.mark.parametrize("text, want", [
    ("uv venv && uv pip install torch", ("uv",)), ("uvx ruff check", ("uv",)), ("cd x; uv sync", ("uv",)),
    ("conda activate myenv", ("conda",)), ("mamba install -y numpy", ("conda",)),
    ("/opt/conda/envs/pytorch/bin/python x.py", ()), ("cat uv.lock", ()), ("conda-forge", ()),
    ("echo $UV_CACHE_DIR", ()), ("~/.local/bin/uv sync", ()),
])
def test_a_tool_is_needed_where_its_name_is_a_word_not_part_of_a_path_or_name(text, want):
    assert tools.needed(text) == want


def _bin(tmp_path: Path, scripts: dict[str, str]) -> Path:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (bin_ / name).write_text("#!/bin/bash\n" + body)
        (bin_ / name).chmod(0o755)
    return bin_


def _setup(tmp_path: Path, bin_: Path, lines: str, then: str = "") -> subprocess.CompletedProcess:
    """``lines`` then ``then`` as the setup runs them: bash, HOME its own, the stand-ins first on PATH."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": f"{bin_}:/usr/bin:/bin", "EC2GPU_PYTHON": str(bin_ / "python3")}
    return subprocess.run(["bash", "-c", lines + then], env=env, capture_output=True, text=True, timeout=60)


def _fake_miniforge(tmp_path: Path, sha: str | None = None) -> Path:
    """A stand-in Miniforge installer (its `-b -p PREFIX` makes PREFIX/bin/conda, a conda that knows
    `shell.bash hook`, `init bash` and `config`), served by a stand-in curl with its sha256 beside it."""
    installer = tmp_path / "Miniforge3.sh"
    installer.write_text(
        '#!/bin/bash\nprefix="$3"; mkdir -p "$prefix/bin"\n'
        "cat > \"$prefix/bin/conda\" <<'EOF'\n#!/bin/bash\n"
        'echo "conda $*" >> "$HOME/conda-calls"\n'
        'case "$1 $2" in\n'
        '  "shell.bash hook") echo "conda() { echo conda-function \\"\\$@\\"; }";;\n'
        '  "init bash") printf "# >>> conda initialize >>>\\nconda() { echo conda-function; }\\n" >> "$HOME/.bashrc";;\n'
        "esac\nEOF\n"
        'chmod +x "$prefix/bin/conda"\n')
    (tmp_path / "Miniforge3.sh.sha256").write_text(f"{sha or hashlib.sha256(installer.read_bytes()).hexdigest()}  "
                                                   "Miniforge3-Linux-x86_64.sh\n")
    return _bin(tmp_path, {"curl": f'echo "$@" >> {tmp_path}/curl-calls\nout=""; url=""\n'
                                   'while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; -*) ;; *) url="$1";; esac; '
                                   'shift; done\n'
                                   f'case "$url" in *.sha256) cp {tmp_path}/Miniforge3.sh.sha256 "$out";; '
                                   f'*) cp {tmp_path}/Miniforge3.sh "$out";; esac\n'})


def test_the_conda_step_installs_miniforge_checked_once_and_the_run_has_conda(tmp_path):
    bin_ = _fake_miniforge(tmp_path)
    lines = tools.install_lines(("conda",))
    got = _setup(tmp_path, bin_, lines, "conda activate x\n")
    assert got.returncode == 0, got.stdout + got.stderr
    home = tmp_path / "home"
    assert (home / "miniforge3" / "bin" / "conda").is_file()
    assert "conda-function activate x" in got.stdout  # the setup's own lines have conda, a function as conda's
    calls = (tmp_path / "curl-calls").read_text().splitlines()
    assert [c.split()[-1] for c in calls] == [tools.MINIFORGE_URL.replace("$(uname -m)", _machine()),
                                              tools.MINIFORGE_URL.replace("$(uname -m)", _machine()) + ".sha256"]
    conda_calls = (home / "conda-calls").read_text()
    assert "config --set auto_activate_base false" in conda_calls and "init bash" in conda_calls
    # the run's bash -i reads ~/.bashrc (wire/shell.py): conda is there
    run = subprocess.run(["bash", "-i", "-c", "type conda >/dev/null && echo has-conda"], capture_output=True,
                         text=True, env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=30)
    assert "has-conda" in run.stdout
    # the next setup there (a standing instance, a baked image) downloads nothing and inits once
    again = _setup(tmp_path, bin_, lines)
    assert again.returncode == 0 and len((tmp_path / "curl-calls").read_text().splitlines()) == 2
    assert (home / ".bashrc").read_text().count(">>> conda initialize >>>") == 1


def test_a_miniforge_installer_that_is_not_the_published_one_is_not_run(tmp_path):
    bin_ = _fake_miniforge(tmp_path, sha="0" * 64)
    got = _setup(tmp_path, bin_, tools.install_lines(("conda",)), "echo the-own-setup-ran\n")
    assert got.returncode == 1 and "conda could not be installed" in got.stdout
    assert not (tmp_path / "home" / "miniforge3").exists() and "the-own-setup-ran" not in got.stdout


def _machine() -> str:
    return subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip()


def test_the_uv_step_installs_uv_from_pypi_once_and_the_run_has_it(tmp_path):
    """pip (the Python setup found) puts uv in ~/.local/share/ec2gpu-uv; ~/.local/bin links it and
    is on PATH for the setup and, through ~/.bashrc, for the run. No curl when pip worked."""
    bin_ = _bin(tmp_path, {
        "python3": f'echo "$@" >> {tmp_path}/pip-calls\nwhile [ "$1" != --target ]; do shift; done\n'
                   'mkdir -p "$2/bin"; printf "#!/bin/bash\\necho uv 0.0-stand-in\\n" > "$2/bin/uv"; '
                   'cp "$2/bin/uv" "$2/bin/uvx"; chmod +x "$2/bin/uv" "$2/bin/uvx"\n',
        "curl": f'echo "$@" >> {tmp_path}/curl-calls; exit 1\n'})
    lines = tools.install_lines(("uv",))
    got = _setup(tmp_path, bin_, lines, "uv --version\n")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "uv 0.0-stand-in" in got.stdout and not (tmp_path / "curl-calls").exists()
    assert "-m pip install" in (tmp_path / "pip-calls").read_text()
    home = tmp_path / "home"
    assert (home / ".local" / "bin" / "uv").resolve() == home / ".local" / "share" / "ec2gpu-uv" / "bin" / "uv"
    run = subprocess.run(["bash", "-i", "-c", "uv --version"], capture_output=True, text=True,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=30)
    assert "uv 0.0-stand-in" in run.stdout
    again = _setup(tmp_path, bin_, lines)
    assert again.returncode == 0 and len((tmp_path / "pip-calls").read_text().splitlines()) == 1
    assert (home / ".bashrc").read_text().count("ec2gpu: ~/.local/bin") == 1


def test_without_pip_uv_comes_from_astrals_installer_as_skypilot_gets_it(tmp_path):
    bin_ = _bin(tmp_path, {"python3": "exit 1\n",
                           "curl": f'echo "$@" >> {tmp_path}/curl-calls\n'
                                   "printf 'mkdir -p \"$UV_INSTALL_DIR\"; printf \"#!/bin/sh\\\\necho uv-astral\\\\n\" "
                                   "> \"$UV_INSTALL_DIR/uv\"; chmod +x \"$UV_INSTALL_DIR/uv\"\\n'\n"})
    got = _setup(tmp_path, bin_, tools.install_lines(("uv",)), "uv\n")
    assert got.returncode == 0, got.stdout + got.stderr
    assert tools.UV_INSTALLER_URL in (tmp_path / "curl-calls").read_text() and "uv-astral" in got.stdout


def test_the_plan_says_which_tools_the_setup_installs_in_one_line(no_aws, monkeypatch, capsys):
    (no_aws / "t.yaml").write_text("name: t\nresources: {accelerators: T4}\nsetup: uv pip install -r r.txt\n"
                                   "run: python x.py\n")
    monkeypatch.chdir(no_aws)
    assert cli.main(["run", "t.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("  tools:")]
    assert len(said) == 1 and "uv installed by the setup on first use" in said[0]
    assert "    uv pip install -r r.txt" in out and "ec2gpu: installing uv" not in out  # its own setup, as written
    assert cli.main(["run", "t.yaml", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [t["tool"] for t in plan["tools"]] == ["uv"] and plan["setup"] == "uv pip install -r r.txt"


def test_a_skypilot_task_file_gets_skypilots_disk_unless_it_names_one():
    sky = "name: s\nresources:\n  accelerators: T4:1\n{}run: python x.py\n"
    assert load.parse(sky.format("")).task.resources.disk_gib == skypilot.DEFAULT_DISK_GIB == 256
    assert load.parse(sky.format("  disk_size: 100\n")).task.resources.disk_gib == 100
    assert load.parse("name: e\nresources: {gpu: T4}\nrun: python x.py\n").task.resources.disk_gib is None  # ours


def test_a_detached_runs_spec_carries_the_install_lines_to_its_agent():
    """A detached run's agent runs spec.json's setup (agent/attempt.py): the lines are in it, so the
    instance gets uv as a run in the foreground does."""
    from datetime import datetime, timezone

    from ec2gpu.runs.detached import launch
    from ec2gpu.runs.execute import engine
    from ec2gpu.runs.options import RunOptions
    job = engine.TaskJob(load.parse("name: d\nrun: uv run train.py\n"), {}, None)
    run_id, at = "20261125-103000-1a2b", datetime(2026, 11, 25, 18, 0, tzinfo=timezone.utc)
    spec = launch.spec_document(job, RunOptions(task=job, max_runtime_minutes=60), "AIDAEXAMPLEUSER0001", run_id,
                                f"ec2gpu-{run_id}", at, 2)
    assert spec["setup"] == tools.install_lines(("uv",))


def test_an_image_baked_from_the_task_keeps_the_tools(tmp_path):
    """ami/clean-for-image.sh removes keys, histories and run directories before CreateImage, not
    what the setup installed: ~/.local/bin/uv and ~/miniforge3 are in the image, and its runs install
    nothing (their setup finds them)."""
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "uv").write_text("#!/bin/sh\n")
    (home / "miniforge3" / "bin").mkdir(parents=True)
    (home / "miniforge3" / "bin" / "conda").write_text("#!/bin/sh\n")
    script = Path(tools.__file__).parents[1] / "ami" / "clean-for-image.sh"
    got = subprocess.run(["bash", str(script)], env={"HOME": str(home), "PATH": "/usr/bin:/bin",
                                                     "EC2GPU_SANDBOX_INSTANCE": "1"},
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert (home / ".local" / "bin" / "uv").is_file() and (home / "miniforge3" / "bin" / "conda").is_file()
