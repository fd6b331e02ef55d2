"""A non-editable install (a built wheel in a fresh virtual environment) sets instances up and
trains: everything the package ships to instances is inside the wheel, nothing is read from the
source tree."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ec2gpu.sandbox import control

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_installed_in_a_fresh_venv_runs_the_sandbox_job(tmp_path, mnist_dir):
    src = tmp_path / "src"  # a copy: building must not write into the checkout
    shutil.copytree(ROOT / "ec2gpu", src / "ec2gpu", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(src)], check=True)
    (wheel,) = (tmp_path / "dist").glob("ec2gpu-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # the dependencies (boto3, torch, moto, ...) come from this environment, read as plain paths (its
    # .pth files, the editable install's among them, are not processed); ec2gpu only from the wheel
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import ec2gpu; print(ec2gpu.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(site) and (site / "ec2gpu" / "ami" / "setup-gpu.sh").is_file()

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "EC2GPU_"))}
    env.update(EC2GPU_HOME=str(home), EC2GPU_DATA_DIR=str(mnist_dir))
    try:
        done = subprocess.run([str(venv / "bin" / "ec2gpu"), "train", "mnist", "--sandbox", "--json",
                               "--out", str(tmp_path / "run"), "--trainer-arg=--train-subset=2000"],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    finally:
        control.down(home)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["status"] == "completed" and record["phases"]["setup"] > 0
    assert "torch" in done.stderr and "CUDA available" in done.stderr  # setup-gpu.sh's own report
