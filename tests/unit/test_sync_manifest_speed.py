"""Issue 29, item 13: a workdir's ignore rules are compiled once per set of rules, not once per file,
with the same files chosen (negation, anchored rules, .ec2gpuignore on top, secrets withheld).
Times are printed by scripts/bench_manifest.py, never asserted here."""
import shutil
import subprocess

import pathspec
import pytest

from ec2gpu.remote import sync


@pytest.fixture
def compiled(monkeypatch):
    """The list of rule sets compiled while the test runs (the pattern count of each PathSpec built)."""
    built = []
    init = pathspec.PathSpec.__init__

    def counting(self, patterns, *a, **k):
        patterns = list(patterns)
        built.append(len(patterns))
        init(self, patterns, *a, **k)
    monkeypatch.setattr(pathspec.PathSpec, "__init__", counting)
    return built


def workdir(root, n=300):
    """``n`` files in nested folders, some ignored by .gitignore (a negation and an anchored rule
    among them), some by .ec2gpuignore, a few secrets."""
    (root / ".gitignore").write_text("*.log\n!keep.log\n/top.txt\nbuild/\n")
    (root / ".ec2gpuignore").write_text("*.tmp\n!keep.tmp\n")
    for i in range(n):
        (root / f"src/p{i % 7}/s{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"src/p{i % 7}/s{i % 3}/f{i:04d}.py").write_text("x")
    for rel in ("a.log", "keep.log", "sub/keep.log", "top.txt", "sub/top.txt", "build/out.bin", "x.tmp", "keep.tmp",
                "deploy.pem", "conf/.env", "sub/build/y"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("r")


EXPECTED_OTHERS = [".ec2gpuignore", ".gitignore", "keep.log", "keep.tmp", "sub/keep.log", "sub/top.txt"]


@pytest.mark.parametrize("repo", [False, True])
def test_each_set_of_rules_is_compiled_once_per_manifest_not_once_per_file(tmp_path, compiled, repo):
    workdir(tmp_path)
    if repo:
        if not shutil.which("git"):
            pytest.skip("git not installed")
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    m = sync.manifest(tmp_path)
    # .gitignore (outside git), .ec2gpuignore with OWN_ARTIFACTS, NEVER_SEND: at most three, whatever the file count
    assert len(compiled) <= 3, f"{len(compiled)} rule sets compiled for {len(m.files)} files"
    assert len(m.files) == 300 + len(EXPECTED_OTHERS)
    assert [f for f in m.files if not f.startswith("src/")] == EXPECTED_OTHERS
    assert sorted(m.withheld) == ["conf/.env", "deploy.pem"]


def test_rules_that_change_between_two_manifests_are_honoured(tmp_path, monkeypatch):
    """The compiled rules are kept by their text: an edited .ec2gpuignore or another NEVER_SEND is
    never answered with rules compiled earlier."""
    workdir(tmp_path, n=3)
    assert "keep.tmp" in sync.manifest(tmp_path).files
    (tmp_path / ".ec2gpuignore").write_text("*.tmp\n")
    m = sync.manifest(tmp_path)
    assert "keep.tmp" not in m.files and "x.tmp" not in m.files
    (tmp_path / "w.secret").write_text("s")
    assert "w.secret" in sync.manifest(tmp_path).files and not sync.withheld(tmp_path / "w.secret")
    monkeypatch.setattr(sync, "NEVER_SEND", [*sync.NEVER_SEND, "*.secret"])
    assert "w.secret" in sync.manifest(tmp_path).withheld and sync.withheld(tmp_path / "w.secret")


def test_withheld_compiles_the_secret_rules_once_across_calls(tmp_path, compiled):
    (tmp_path / "a.pem").write_text("k")
    (tmp_path / "ok.py").write_text("x")
    assert [sync.withheld(tmp_path / name) for name in ("a.pem", "ok.py") * 20] == [True, False] * 20
    assert len(compiled) <= 1
