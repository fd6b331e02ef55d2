"""`ec2gpu doctor`: every precondition of a run, checked in order, one line each: pass, or what to fix."""
from __future__ import annotations

import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import Ec2GpuError


@dataclass
class Check:
    """One line of the report. ``ok`` None means "could not tell" (not a failure)."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _run(name: str, fn) -> Check:
    """Call ``fn() -> (ok, detail[, fix])``; an Ec2GpuError or AWS error becomes a failed check."""
    import botocore.exceptions
    try:
        ok, detail, *fix = fn()
        return Check(name, ok, detail, fix[0] if fix else "")
    except Ec2GpuError as exc:
        return Check(name, False, exc.message, exc.hint)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        return Check(name, False, str(exc).splitlines()[0][:200], "see docs/iam-policy.json and docs/troubleshooting.md")


def _spot_role(aws, spot: bool) -> tuple:
    """The spot service-linked role: present (ok), unreadable (unknown), or missing (a failure only
    when --spot is asked for), with the command that creates it."""
    from ..aws import capacity
    exists = capacity.spot_role_exists(aws.client("iam"))
    if exists:
        return True, f"{capacity.SPOT_ROLE} exists"
    if exists is None:
        return None, f"could not read the role {capacity.SPOT_ROLE} (iam:GetRole, docs/iam-policy.json)"
    return (False if spot else None), (
        f"{capacity.SPOT_ROLE} does not exist yet: the account's first spot request creates it only if these "
        "credentials may (iam:CreateServiceLinkedRole)" + ("" if spot else "; needed for --spot only")), \
        capacity.SPOT_ROLE_COMMAND


def _type_facts(aws, instance_type: str) -> tuple:
    """The instance type's GPUs and vCPUs as EC2 describes them (aws/types.py), and from where."""
    from ..aws import types
    f = types.facts(aws.ec2, instance_type)
    return True, f"{f.name}: {f.gpu_count}x {f.gpu}, {f.vcpus} vCPUs ({f.source})"


def run_checks(aws, settings, instance_type: str, spot: bool, sandbox: bool) -> list[Check]:
    """All checks for launching ``instance_type`` with ``aws`` (an aws.session.Aws) and ``settings``."""
    from ..aws import capacity, catalog, images, network

    checks = [_run("credentials", lambda: (True, aws.check_credentials()["Arn"]))]
    if checks[0].ok is False:
        return checks  # nothing else can be asked without them
    ec2 = aws.ec2

    def vpc():
        vpc_id = network.default_vpc(ec2)
        subnets = capacity.default_subnets(ec2)
        zones = capacity.zones_offering(ec2, instance_type)
        usable = [z for z in zones if z in subnets]
        if not usable:
            return False, f"{vpc_id}: no default subnet in a zone offering {instance_type}", \
                "create default subnets: aws ec2 create-default-subnet --availability-zone ZONE"
        return True, f"{vpc_id}, default subnets in {len(subnets)} zones; {instance_type} offered in {', '.join(usable)}"

    def quota():
        notes: list[str] = []
        got = capacity.check_quota(aws.client("service-quotas"), ec2, instance_type, spot, log=notes.append)
        if got is None:
            return None, notes[0] if notes else f"{instance_type} is not counted by the G and VT quotas"
        return True, f"{got['quota']}: {got['value']:g} vCPUs, {got['in_use']} in use, {got['needed']} needed"

    def ami():
        a = images.resolve_ami(aws.client("ssm"), ec2)
        return True, f"{a['ImageId']} {a['Name']}: {a['why']} (via {a['source'].split(':')[0]})"

    def price():
        p = catalog.on_demand_price(instance_type, aws.region, settings.home)
        return (p.usd_per_hour is not None, f"{instance_type} on-demand {p.usd_per_hour} USD/h ({p.source})") + \
            (() if p.usd_per_hour is not None else (f"ec2gpu prices --refresh --region {aws.region}",))

    checks += [
        _run("region", lambda: (True, f"{aws.region}" + (" (sandbox)" if sandbox else ""))),
        _run("instance type", lambda: _type_facts(aws, instance_type)),
        _run("default VPC", vpc),
        _run("GPU vCPU quota", quota),
        _run("AMI", ami),
        _run("spot role", lambda: _spot_role(aws, spot)),
        _run("your IP", lambda: (True, f"SSH will be allowed from {network.ssh_cidr(None)} only")),
        _run("price", price),
        _run("ssh client", lambda: (bool(shutil.which("ssh")), shutil.which("ssh") or "no `ssh` on PATH",
                                    "install OpenSSH's client (apt-get install openssh-client) for `ec2gpu ssh`")),
        _run("key files", lambda: key_files(settings.keys_dir)),
    ]
    if sandbox:
        from ..sandbox import sshd
        checks.append(_run("sshd (sandbox)", lambda: (True, sshd.sshd_binary())))
    return checks


def key_files(keys_dir: Path):
    """(ok, detail, fix): every private key under ``keys_dir`` is mode 0600."""
    keys = sorted(keys_dir.glob("*.pem")) if keys_dir.is_dir() else []
    loose = [k for k in keys if stat.S_IMODE(k.stat().st_mode) & 0o077]
    if loose:
        return False, f"{len(loose)} key file(s) readable by others: {', '.join(k.name for k in loose)}", \
            f"chmod 600 {' '.join(str(k) for k in loose)}"
    return True, f"{len(keys)} key file(s) in {keys_dir}, all 0600" if keys else f"none yet ({keys_dir})"
