"""Layers that hold (issue 29, item 9): SSH and file operations on an instance live in remote/,
boto3 calls in aws/; runs/ calls their named functions. So no module of ec2gpu/runs/ calls
fabric's methods on a connection (a receiver named ``conn`` or ``*.conn``), imports fabric,
paramiko, invoke, boto3 or botocore at module level, or calls a boto3 client's method (on a
receiver named like a client: ``ec2``, ``s3``, ``*.ec2``, ``aws.client(...)``; or one of the
transfer methods below, on any receiver). Passing a connection or a client on is fine."""
import ast
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
