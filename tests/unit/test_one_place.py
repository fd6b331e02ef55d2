"""One concept, one place (issue 29, item 12): secret masking, writing run.json."""


def test_a_secret_inside_a_longer_one_leaves_nothing_of_either_in_logs():
    """One masking function per side (issue 45 item 2): job_summary.mask_text on the controller (the
    live log, `ec2gpu logs`, records, a dry run), agent/agent.mask_bytes on the instance (the log it
    uploads; `ec2gpu logs --follow` masks the live log with it too): longest first, so 'abc' inside
    'abcdef' does not leave 'def' readable. No other module of the package defines a masking
    function that callers would go through instead (a wrapper is a second way)."""
    import ast
    from pathlib import Path

    from ec2gpu.agent import agent
    from ec2gpu.runs import job_summary
    line = "token abcdef and abc"
    assert job_summary.mask_text(line, ["abc", "abcdef"]) == "token **** and ****"
    assert agent.mask_bytes(line.encode(), ["abc", "abcdef"]) == b"token **** and ****"
    package = Path(job_summary.__file__).parents[1]
    found = sorted(f"{p.relative_to(package)}:{node.name}" for p in package.rglob("*.py")
                   for node in ast.walk(ast.parse(p.read_text()))
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("mask", "masked")
                   or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("mask_"))
    assert found == ["agent/agent.py:mask_bytes", "pool/follow.py:masked", "runs/job_summary.py:mask",
                     "runs/job_summary.py:mask_text"]


def test_run_json_is_written_whole_by_one_function(tmp_path):
    """record.save: the four places that finish a run (pipeline, exec, --local, bench --local)
    write run.json through it, whole (a temporary file renamed over it), creating the folder."""
    import json
    from datetime import datetime, timezone
    from pathlib import Path

    from ec2gpu.runs.settle import record
    rec = record.new("r-1", "ec2gpu run x", "sandbox", tmp_path / "out", status="completed")
    rec["ended_at"] = datetime(2026, 11, 25, tzinfo=timezone.utc)  # not JSON: written as its str()
    record.save(rec, tmp_path / "out" / "deep")
    got = json.loads((tmp_path / "out" / "deep" / "run.json").read_text())
    assert got["run_id"] == "r-1" and got["ended_at"] == "2026-11-25 00:00:00+00:00"
    assert [p.name for p in (tmp_path / "out" / "deep").iterdir()] == ["run.json"]
    src = Path(record.__file__).parents[1]  # every module of runs/
    assert not [p.name for p in src.rglob("*.py") if '/ "run.json").write_text' in p.read_text()]


def test_ssh_to_an_instance_is_opened_verified_in_one_place():
    """Every command that reaches an instance (a run's nodes, launch, start, logs) waits for SSH and
    checks its host key against the console through runs/execute/nodes.connect_verified, not a copy."""
    from pathlib import Path

    from ec2gpu.runs.execute import nodes
    src = Path(nodes.__file__).parents[2]  # ec2gpu/
    callers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if "wait_for_ssh(" in p.read_text()
                     and p.name != "ssh.py")
    assert callers == ["runs/execute/nodes.py"]


def test_a_bake_teardown_that_cannot_list_its_images_still_removes_its_role(monkeypatch, tmp_path):
    """Teardown through the registry: one failing step (listing a bake's images) is reported, and
    the run's instance role is still removed."""
    from types import SimpleNamespace

    from ec2gpu.aws import baked
    from ec2gpu.aws import iam as roles
    from ec2gpu.runs.provision import resources as provision

    def cannot_list(*_a, **_k):
        raise RuntimeError("DescribeImages refused")
    deleted = []
    monkeypatch.setattr(baked, "images", cannot_list)
    monkeypatch.setattr(roles, "delete_run_role", lambda iam, name: deleted.append(name))
    prov = provision.Provisioned("run-b", bake=True)
    prov.instance_profile = "ec2gpu-run-b"
    aws = SimpleNamespace(ec2=object(), region="us-east-1", client=lambda name: f"{name} client")

    class Ui:
        def note(self, line):
            pass

        def phase(self, name):
            import contextlib
            return contextlib.nullcontext()
    removed = provision.teardown(aws, SimpleNamespace(keys_dir=tmp_path), prov, Ui())
    assert deleted == ["ec2gpu-run-b"] and removed["instance_roles"] == ["ec2gpu-run-b"]
    assert any("images of the bake" in f for f in removed["failed"])
