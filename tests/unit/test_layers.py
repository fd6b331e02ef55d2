"""Layers that hold (issue 29, item 9): SSH and file operations on an instance live in remote/,
boto3 calls in aws/; runs/ calls their named functions. So no module of ec2gpu/runs/ calls
fabric's methods on a connection (a receiver named ``conn`` or ``*.conn``), imports fabric,
paramiko, invoke, boto3 or botocore at module level, or calls a boto3 client's method (on a
receiver named like a client: ``ec2``, ``s3``, ``*.ec2``, ``aws.client(...)``; or one of the
transfer methods below, on any receiver). Passing a connection or a client on is fine.

And (issue 45, item 3) runs/'s subpackages keep one order (RUNS_ORDER), counting every import."""
import ast
import re
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "ec2gpu" / "runs"
#: fabric Connection methods that send a command or a file, or open SFTP
CONN_METHODS = {"run", "sudo", "put", "get", "sftp", "local", "shell"}
#: module-level imports that belong to remote/ (fabric, paramiko, invoke) and aws/ (boto3, botocore)
HEAVY = {"fabric", "paramiko", "invoke", "boto3", "botocore"}
#: names a boto3 client goes by in runs/ (aws/session.Aws's attributes, recovery.DirCheckpoints.s3)
CLIENTS = {"ec2", "s3", "iam", "ssm", "sts", "pricing", "service_quotas"}
#: boto3 client methods no other object in runs/ has (S3's managed transfers and the calls once made here)
CLIENT_ONLY = {"upload_file", "upload_fileobj", "download_file", "download_fileobj", "put_object", "get_object",
               "delete_object", "reboot_instances", "run_instances", "terminate_instances", "stop_instances",
               "start_instances", "create_image", "deregister_image"}


def _name(node: ast.expr) -> str | None:
    """The last name of a receiver: ``conn`` for ``conn``, ``nd.conn``, ``self.conn``; None for others."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_client_call(node: ast.expr) -> bool:
    """``aws.client("s3")`` and the like: a call of an attribute named ``client``."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "client"


def _imported(tree: ast.Module) -> set[str]:
    """The names the module's imports bind, anywhere in it (``iam`` for ``from ..aws import iam``)."""
    return {(a.asname or a.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for a in node.names}


def offences(source: str) -> list[str]:
    """What in ``source`` (a runs/ module's text) crosses a layer: one line per call or import."""
    tree = ast.parse(source)
    modules = _imported(tree)  # aws/iam.py's functions are not an IAM client's methods
    out = []
    for node in tree.body:  # module level only: a function may import botocore to catch its errors
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] in HEAVY]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            bad = [node.module] if (node.module or "").split(".")[0] in HEAVY else []
        else:
            continue
        out += [f"line {node.lineno}: imports {b} at module level" for b in bad]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, node.func.value
        name = _name(receiver)
        if name == "conn" and method in CONN_METHODS:
            out.append(f"line {node.lineno}: {ast.unparse(node.func)}(...) on a connection (remote/ has a function)")
        elif (name in CLIENTS and not (isinstance(receiver, ast.Name) and name in modules)) or _is_client_call(receiver):
            out.append(f"line {node.lineno}: {ast.unparse(node.func)}(...) on a boto3 client (aws/ has a function)")
        elif method in CLIENT_ONLY:
            out.append(f"line {node.lineno}: {ast.unparse(node.func)}(...), a boto3 client method (aws/ has a function)")
    return out


@pytest.mark.parametrize("path", sorted(RUNS.rglob("*.py")), ids=lambda p: str(p.relative_to(RUNS)))
def test_runs_calls_remote_and_aws_not_fabric_or_boto3(path):
    assert offences(path.read_text()) == []


@pytest.mark.parametrize("source, found", [
    ("nd.conn.run('true', hide=True)", 1),
    ("conn.put(x, y)", 1),
    ("self.conn.sftp()", 1),
    ("conn.sudo('x'); conn.get('a')", 2),
    ("aws.ec2.reboot_instances(InstanceIds=[i])", 1),
    ("self.s3.upload_file(p, b, k)", 1),
    ("aws.client('s3').put_object(Bucket=b)", 1),
    ("client.upload_file(p, b, k)", 1),
    ("import boto3", 1),
    ("from fabric import Connection", 1),
    ("from paramiko import SSHException", 1),
    ("def f():\n    import botocore.exceptions", 0),  # inside a function: to catch its errors
    ("settings.get('x'); d.get('conn'); job.run(x); nd.conn.close()", 0),
    ("instances.describe_instances(aws.ec2, ids); ssh.run(conn, 'true'); files.put_file(nd.conn, a, b)", 0),
    ("aws.client('iam')", 0),  # made and passed on to aws/
    ("from ..aws import iam, pricing\niam.boundary_arn(c, a); pricing.current_spot_prices(ec2, t)", 0),  # aws/ modules
    ("iam.delete_role(RoleName=r)", 1),  # not imported here: a client
    ("storage.upload(self.s3, p, b, k)", 0),
])
def test_the_check_sees_what_crosses_and_nothing_else(source, found):
    assert len(offences(source)) == found


#: the keys of EC2's Instance structure (botocore's ec2 model) that aws/instances.Instance carries as fields
INSTANCE_KEYS = {"InstanceId", "InstanceType", "State", "LaunchTime", "KeyName", "Placement", "PublicIpAddress",
                 "PrivateIpAddress", "InstanceLifecycle", "StateReason", "StateTransitionReason", "AmiLaunchIndex",
                 "SecurityGroups", "SubnetId"}
ABOVE_AWS = [p for top in ("runs", "api", "cli") for p in (RUNS.parent / top).rglob("*.py")] + [RUNS.parent / "backend.py"]


def instance_indexings(source: str) -> list[str]:
    """``x["InstanceId"]`` and ``x.get("LaunchTime")``-style reads of EC2's instance dicts in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if key in INSTANCE_KEYS:
            out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("path", sorted(ABOVE_AWS), ids=lambda p: str(p.relative_to(RUNS.parent)))
def test_above_aws_an_instance_is_an_instance_not_ec2s_dict(path):
    """Issue 29 item 6: aws/ returns aws/instances.Instance; nothing above it indexes DescribeInstances entries."""
    assert instance_indexings(path.read_text()) == []


def test_the_indexing_check_sees_both_spellings():
    assert len(instance_indexings('i["InstanceId"]; d.get("LaunchTime"); row["instance_id"]; x.get("name")')) == 2


def test_an_instance_is_read_from_ec2s_description_once():
    from datetime import datetime, timezone

    from ec2gpu.aws.instances import Instance
    launched = datetime(2026, 11, 25, 9, 0, tzinfo=timezone.utc)
    got = Instance.of({
        "InstanceId": "i-1", "InstanceType": "g5.xlarge", "State": {"Name": "terminated"}, "LaunchTime": launched,
        "InstanceLifecycle": "spot", "Placement": {"AvailabilityZone": "us-east-1b", "GroupName": ""},
        "PublicIpAddress": "203.0.113.9", "PrivateIpAddress": "172.31.0.9", "KeyName": "k", "ImageId": "ami-1",
        "SubnetId": "subnet-1", "SecurityGroups": [{"GroupId": "sg-1", "GroupName": "g"}], "AmiLaunchIndex": 2,
        "Tags": [{"Key": "Name", "Value": "dev"}, {"Key": "ec2gpu:run", "Value": "r1"}, {"Key": "ec2gpu:node", "Value": "3"}],
        "StateReason": {"Code": "Server.SpotInstanceTermination", "Message": "Server.SpotInstanceTermination: ..."},
        "StateTransitionReason": "Service initiated (2026-11-25 10:30:00 GMT)"})
    assert (got.id, got.type, got.state, got.market, got.zone, got.placement_group) == (
        "i-1", "g5.xlarge", "terminated", "spot", "us-east-1b", None)
    assert (got.public_ip, got.private_ip, got.key_name, got.image_id, got.subnet_id, got.security_group_ids) == (
        "203.0.113.9", "172.31.0.9", "k", "ami-1", "subnet-1", ("sg-1",))
    assert (got.name, got.run_id, got.node, got.launch_index, got.launched_at) == ("dev", "r1", 3, 2, launched)
    assert got.state_reason_code == "Server.SpotInstanceTermination" and got.billing_start is None
    assert got.transitioned_at == datetime(2026, 11, 25, 10, 30, tzinfo=timezone.utc)
    on_demand = Instance.of({"InstanceId": "i-2", "InstanceType": "g5.xlarge", "LaunchTime": launched})
    assert (on_demand.market, on_demand.state, on_demand.tags, on_demand.node, on_demand.state_reason) == (
        "on-demand", "pending", {}, None, "")



# --- the order of runs/'s subpackages (issue 45, item 3) -----------------------------------------

#: runs/'s subpackages, first the lowest: a module imports only its own and those before it, counting
#: every import (TYPE_CHECKING and function-local ones too). "" is runs/'s own modules (options, job,
#: job_summary: the types and the summary reader every stage shares). docs/architecture.md says why.
RUNS_ORDER = ("", "settle", "plan", "recover", "execute", "provision", "detached", "standing")


def _import_graph() -> dict[str, set[str]]:
    """scripts/structure_figures.py's graph of the package (every import counted): module -> modules."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("structure_figures", RUNS.parents[1] / "scripts" / "structure_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    mods = figures.modules()
    return {m: {t for t, _ in figures.imports(m, p, mods, ast.parse(p.read_text()))} for m, p in mods.items()}


def _stage(module: str) -> str | None:
    """runs/'s subpackage of ``module`` ("" for runs/'s own modules), None outside runs/."""
    parts = module.split(".")
    if parts[0] != "runs":
        return None
    return parts[1] if len(parts) > 2 else ""


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import in ``graph`` from a runs/ subpackage to one after it in RUNS_ORDER."""
    out = []
    for module, targets in sorted(graph.items()):
        here = _stage(module)
        for target in sorted(targets):
            there = _stage(target)
            if here is not None and there is not None and RUNS_ORDER.index(there) > RUNS_ORDER.index(here):
                out.append(f"{module} -> {target}")
    return out


def test_runs_subpackages_import_only_those_before_them():
    graph = _import_graph()
    assert {_stage(m) for m in graph if m.startswith("runs.")} == set(RUNS_ORDER)  # every subpackage has its place
    assert upward(graph) == []


def test_the_order_check_sees_an_import_that_runs_back_up():
    assert upward({"runs.plan.costs": {"runs.settle.ledger", "runs.job", "runs.execute.engine", "aws.catalog"},
                   "runs.job": {"runs.job_summary"}, "runs.options": {"runs.provision.bake"}}) == [
        "runs.options -> runs.provision.bake", "runs.plan.costs -> runs.execute.engine"]


def test_runs_never_imports_pool():
    """The pool plugs its strategy into runs/ (api/tasks.start hands pipeline.run_job pool/attempt.run_attempt);
    no module of runs/ imports pool/, at module level, in a function or under TYPE_CHECKING."""
    graph = _import_graph()
    assert "runs.element_table" in graph["pool.follow"]  # the graph sees pool/'s imports of runs/
    assert [f"{m} -> {t}" for m, ts in sorted(graph.items()) if m.startswith("runs.")
            for t in sorted(ts) if t == "pool" or t.startswith("pool.")] == []


# --- api/, pool/ and cli/ too: each library in the layer that owns it (issue 45, item 3) -----------

PACKAGE = RUNS.parent
#: the layers above aws/ and remote/ that call them (runs/ is checked above, module by module)
ABOVE = sorted(p for top in ("api", "pool", "cli") for p in (PACKAGE / top).rglob("*.py"))
#: who may import boto3 or botocore: aws/ (the one place that calls AWS), sandbox/ (the emulator: moto's
#: server and its hooks) and agent/ (shipped to the instance with boto3 of its own)
AWS_OWNERS = ("aws", "sandbox", "agent")
#: who may use SSH: remote/ (fabric, paramiko, OpenSSH) and sandbox/ (the instance side: sshd and its host keys)
SSH_OWNERS = ("remote", "sandbox")
#: what is not in its layer yet, each with why; empty when every module keeps its layer
ALLOWED: set[tuple[str, str]] = set()


def _top(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def library_imports(source: str, libraries: set[str]) -> list[str]:
    """Every import of one of ``libraries`` in ``source``, at any level (module, function, TYPE_CHECKING)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        out += [f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in libraries]
    return out


def openssh_spawns(source: str) -> list[str]:
    """Every argv list in ``source`` whose first word is OpenSSH's ``ssh`` ("ssh" or shutil.which("ssh") or ...)."""
    return [f"line {node.lineno}: argv {ast.unparse(node)[:60]}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.List) and node.elts and re.search(r"""(^|\W)['"]ssh['"]""", ast.unparse(node.elts[0]))]


def _offences_of(path: Path) -> list[str]:
    rel = str(path.relative_to(PACKAGE))
    source = path.read_text()
    found = []
    if _top(path) not in AWS_OWNERS:
        found += library_imports(source, {"boto3", "botocore"})
    if _top(path) not in SSH_OWNERS:
        found += library_imports(source, {"fabric", "paramiko", "invoke"}) + openssh_spawns(source)
    return [f for f in found if (rel, f.split(": ", 1)[1]) not in ALLOWED]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_boto3_only_in_aws_and_ssh_only_in_remote(path):
    """boto3 and botocore are imported in aws/ alone (sandbox/ and agent/ aside, see AWS_OWNERS): the layers
    above catch aws/session's AWS_ERRORS and ClientError; fabric, paramiko and OpenSSH are used in remote/ alone
    (api/access.ssh runs remote/ssh_config.openssh)."""
    assert _offences_of(path) == []


@pytest.mark.parametrize("path", ABOVE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_api_pool_and_cli_call_remote_and_aws_not_fabric_or_boto3(path):
    """runs/'s check (no fabric method on a connection, no boto3 client method) on api/, pool/ and cli/ too."""
    assert offences(path.read_text()) == []


def test_remote_imports_no_task_run_or_api_module():
    """remote/ does what it is told on an instance: it imports errors, inert, words, wire/ and itself, nothing
    above (remote/mounts reads a file_mounts entry through its own Protocol, not tasks/mounts)."""
    graph = _import_graph()
    assert {t.split(".")[0] for m, ts in graph.items() if m.startswith("remote.") for t in ts} <= {
        "errors", "inert", "words", "wire", "remote"}


@pytest.mark.parametrize("source, found", [
    ("import botocore.exceptions", 1),
    ("def f():\n    from botocore.exceptions import ClientError", 1),  # inside a function counts here
    ("if TYPE_CHECKING:\n    import boto3", 1),
    ("from ..aws.session import AWS_ERRORS, ClientError", 0),
    ("argv = [shutil.which('ssh') or 'ssh', '-F', c, host]", 1),
    ("subprocess.call(['ssh', host])", 1),
    ("subprocess.call(['rsync', '-e', 'ssh -F c', a, b])", 0),  # rsync's own -e: remote/sync builds it
    ("from fabric import Connection", 1),
])
def test_the_library_check_sees_every_import_and_spawn(source, found):
    assert len(library_imports(source, {"boto3", "botocore", "fabric"}) + openssh_spawns(source)) == found
