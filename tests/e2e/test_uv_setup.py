"""A task whose setup calls `uv pip install`, in the sandbox (issue 51 item 9): the Deep Learning AMI has
no uv, SkyPilot's images do; the setup installs it on first use (tasks/tools.py: from PyPI, which the
sandbox's instances reach through this machine's pip configuration) before the task's own lines,
and the run finds it too. Miniforge is not reachable from the sandbox: tests/unit/test_task_tools.py
runs conda's step with a stand-in installer."""
import base64
import hashlib
import json
import shutil
import textwrap
import zipfile

import pytest

from ec2gpu.sandbox import control

from test_run_task import assert_nothing_left, instance_dir  # same folder (pytest prepend import mode)
from test_spot_recovery import drive

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False  # a user project, not the built-in trainer


def _wheel(path) -> None:
    """A one-module wheel (tinypkg 0.1), so `uv pip install` needs no index."""
    files = {"tinypkg.py": b"SAID = 'tinypkg imported'\n",
             "tinypkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
             "tinypkg-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            b"Tag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for n, b in files.items()) + "tinypkg-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
        zf.writestr("tinypkg-0.1.dist-info/RECORD", record)


def test_a_task_whose_setup_calls_uv_pip_install_gets_uv_and_runs(sandbox_env, tmp_path, monkeypatch):
    home, _ = sandbox_env
    proj = tmp_path / "proj"
    proj.mkdir()
    _wheel(proj / "tinypkg-0.1-py3-none-any.whl")
    (proj / "task.yaml").write_text(textwrap.dedent("""\
        name: uvtask
        workdir: .
        setup: |
          uv venv --python "$EC2GPU_PYTHON" "$HOME/tiny-env"
          VIRTUAL_ENV="$HOME/tiny-env" uv pip install --no-index ./tinypkg-0.1-py3-none-any.whl
        run: |
          uv --version
          "$HOME/tiny-env/bin/python" -c "import tinypkg; print(tinypkg.SAID)"
        """))
    monkeypatch.chdir(tmp_path)
    code, stdout, err = drive(["run", "--sandbox", str(proj / "task.yaml"), "--json", "--expect", "1m",
                               "--out", str(tmp_path / "r")], [], timeout_s=420)
    assert code == 0, err
    if not shutil.which("uv", path=control.instance_env()["PATH"]):  # as on the DLAMI: none on the image
        assert "ec2gpu: installing uv into ~/.local/bin" in err  # the setup's output, shown as it runs
    log = (tmp_path / "r" / "job.log").read_text()
    assert "tinypkg imported" in log and log.startswith("uv "), log
    record = json.loads(stdout)
    assert record["status"] == "completed"
    instance_home = instance_dir(home, record["instance_id"]).parent
    assert (instance_home / ".local" / "bin" / "uv").exists()  # kept: the next setup there, or a baked image, has it
    assert_nothing_left(home, record)
