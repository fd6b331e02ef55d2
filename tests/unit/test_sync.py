"""Which workdir files travel: .gitignore + .ec2gpuignore (added, not replacing), never the secrets."""
import shutil
import subprocess

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.remote import sync


def tree(root):
    for rel, text in {"train.py": "x", "data/big.bin": "x" * 100, "notes.txt": "n", ".env": "K=V", ".env.prod": "K=V",
                      "deploy.pem": "k", "keys/id_ed25519": "k", "conf/key.txt": "-----BEGIN RSA PRIVATE KEY-----\n",
                      "sub/model.py": "m", "sub/out/x.bin": "o", ".git/config": "g"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".gitignore").write_text("data/\nout/\n")
    (root / ".ec2gpuignore").write_text("notes.txt\n")


def test_gitignore_and_ec2gpuignore_add_up_and_secrets_stay(tmp_path):
    tree(tmp_path)
    m = sync.manifest(tmp_path)
    assert m.files == [".ec2gpuignore", ".gitignore", "sub/model.py", "train.py"]
    assert sorted(m.withheld) == [".env", ".env.prod", "conf/key.txt", "deploy.pem", "keys/id_ed25519"]
    assert m.bytes == sum((tmp_path / f).stat().st_size for f in m.files)
    assert "deploy.pem" in sync.manifest(tmp_path, allow_secrets=True).files


@pytest.mark.skipif(not shutil.which("git"), reason="git not installed")
def test_inside_a_git_repository_git_decides_then_ec2gpuignore_adds(tmp_path):
    tree(tmp_path)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "sub" / ".gitignore").write_text("model.py\n")  # a nested .gitignore: git honours it
    m = sync.manifest(tmp_path)
    assert m.files == [".ec2gpuignore", ".gitignore", "sub/.gitignore", "train.py"]
    assert ".git/config" not in m.files + m.withheld


def test_a_workdir_above_max_upload_is_refused_with_its_largest_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 2000)
    with pytest.raises(UsageError, match=r"a\.bin") as exc:
        sync.check_size(sync.manifest(tmp_path), max_bytes=1000)
    assert "--max-upload" in exc.value.message + exc.value.hint


@pytest.mark.parametrize("repo", [False, True])
def test_what_ec2gpu_brought_home_earlier_never_goes_up_again_and_a_projects_own_runs_do(tmp_path, repo):
    (tmp_path / "train.py").write_text("x")
    for rel in ("runs/20261122-203042-100a/run.json", "runs/20261122-203042-100a/outputs/model.pt",
                "runs/sweep.yaml", "runs/2026-ablation/notes.md", "sub/runs/20261122-203042-100a/x"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("r")
    if repo:
        if not shutil.which("git"):
            pytest.skip("git not installed")
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    m = sync.manifest(tmp_path)
    assert m.files == ["runs/2026-ablation/notes.md", "runs/sweep.yaml", "sub/runs/20261122-203042-100a/x", "train.py"]
