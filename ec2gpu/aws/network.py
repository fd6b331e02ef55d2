"""Network access: the caller's public IP, the run's security group, and its ed25519 key pair.

The security group opens 22/tcp to the caller's /32 only; 0.0.0.0/0 only when the user passes
``--ssh-cidr 0.0.0.0/0``. Private keys are generated locally (never sent to AWS) and written 0600.
"""
from __future__ import annotations

import ipaddress
import os
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import AwsError, UsageError
from . import tags

if TYPE_CHECKING:  # names only: a run's plan checks --ssh-cidr here without the AWS SDK (runs/plan/runplan.py)
    from .session import Client, Log

#: AWS's own "what is my IP" service; override with EC2GPU_CHECKIP_URL (the sandbox serves one).
CHECKIP_URL = "https://checkip.amazonaws.com"


def caller_ip(url: str | None = None, timeout: float = 5.0) -> str:
    """Return the caller's public IPv4 address as seen by ``url``.

    Raises AwsError when it cannot be found (the hint names --ssh-cidr).
    """
    url = url or os.environ.get("EC2GPU_CHECKIP_URL") or CHECKIP_URL
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode().strip()
        return str(ipaddress.IPv4Address(text))
    except (OSError, ValueError) as exc:
        raise AwsError(f"cannot find this machine's public IP via {url}: {exc}",
                       "pass --ssh-cidr YOUR.IP.ADDR.ESS/32")


def check_cidr(explicit: str, warn: Log = lambda msg: None) -> str:
    """``explicit`` as a normalized CIDR; ``warn`` says who can reach port 22 when its prefix is
    shorter than /24 (0.0.0.0/0: anyone). Raises UsageError for anything that is not a CIDR."""
    try:
        net = ipaddress.ip_network(explicit, strict=False)
    except ValueError:
        raise UsageError(f"--ssh-cidr {explicit!r} is not a CIDR", "use e.g. 203.0.113.7/32 (your public IP)")
    if net.prefixlen < 24:
        who = "anyone on the internet" if net.prefixlen == 0 else f"{net.num_addresses:,} addresses"
        warn(f"warning: --ssh-cidr {net} lets {who} reach port 22 of your instances (the key still guards "
             "them); the default is your own IP/32")
    return str(net)


def ssh_cidr(explicit: str | None, url: str | None = None) -> str:
    """The CIDR allowed to reach port 22: ``explicit`` if given (validated), else caller IP/32."""
    if explicit:
        return check_cidr(explicit)
    return f"{caller_ip(url)}/32"


def default_vpc(ec2: Client) -> str:
    """Return the region's default VPC id. Raises AwsError when the account has none."""
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise AwsError("this region has no default VPC",
                       "create one with `aws ec2 create-default-vpc`, or choose another --region")
    vpc_id: str = vpcs[0]["VpcId"]
    return vpc_id


def security_group_request(run_id: str, owner: str, vpc_id: str) -> dict[str, Any]:
    """create_security_group kwargs for the run (pure)."""
    name = f"ec2gpu-{run_id}"
    return {"GroupName": name, "VpcId": vpc_id,
            "Description": f"ec2gpu run {run_id}: SSH from the caller only",
            "TagSpecifications": [tags.tag_spec("security-group", run_id, owner, name)]}


def ingress_request(group_id: str, cidr: str) -> dict[str, Any]:
    """authorize_security_group_ingress kwargs: 22/tcp from ``cidr`` only (pure)."""
    return {"GroupId": group_id, "IpPermissions": [{
        "IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
        "IpRanges": [{"CidrIp": cidr, "Description": "ec2gpu: SSH from the caller"}]}]}


def create_security_group(ec2: Client, run_id: str, owner: str, cidr: str) -> str:
    """Create the run's security group in the default VPC; return its id."""
    vpc = default_vpc(ec2)
    group_id: str = ec2.create_security_group(**security_group_request(run_id, owner, vpc))["GroupId"]
    ec2.authorize_security_group_ingress(**ingress_request(group_id, cidr))
    return group_id


def allow_within_group(ec2: Client, group_id: str) -> None:
    """Let the group's members reach each other on every port and protocol (torchrun's rendezvous
    on 29500, NCCL/gloo's own ports): a rule whose source is the group itself, not an address."""
    ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "ec2gpu cluster members"}]}])


def generate_key() -> tuple[bytes, str]:
    """A fresh ed25519 key: (private key in OpenSSH PEM format, public key 'ssh-ed25519 AAAA...')."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private, public


def write_private_key(path: Path, private: bytes) -> None:
    """Write ``private`` to ``path`` created with mode 0600 (never readable by others, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)


def create_key_pair(ec2: Client, run_id: str, owner: str, keys_dir: Path) -> tuple[str, Path]:
    """Generate an ed25519 key, import its public half as key pair ``ec2gpu-<run>``.

    Returns (key name, private key path, 0600). Raises AwsError if the import fails (the local
    file is removed again).
    """
    name = f"ec2gpu-{run_id}"
    private, public = generate_key()
    path = private_key_path(keys_dir, name)
    write_private_key(path, private)
    try:
        ec2.import_key_pair(KeyName=name, PublicKeyMaterial=public.encode(),
                            TagSpecifications=[tags.tag_spec("key-pair", run_id, owner, name)])
    except Exception:
        path.unlink(missing_ok=True)
        raise
    return name, path


def delete_key_pair(ec2: Client, name: str, keys_dir: Path) -> None:
    """Delete key pair ``name`` in AWS and its local private key file."""
    ec2.delete_key_pair(KeyName=name)
    private_key_path(keys_dir, name).unlink(missing_ok=True)


def private_key_path(keys_dir: Path, name: str) -> Path:
    """Where the private key of key pair ``name`` lives on this machine (it never leaves it)."""
    return Path(keys_dir) / f"{name}.pem"


def require_private_key(keys_dir: Path, name: str) -> Path:
    """The private key file of key pair ``name``; UsageError when it is not on this machine."""
    path = private_key_path(keys_dir, name)
    if not path.exists():
        raise UsageError(f"the private key {path} is missing", "it lives on the machine that launched the instance")
    return path
