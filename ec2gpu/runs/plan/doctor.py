"""`ec2gpu doctor`: every precondition of a run, checked in order, one line each: pass, or what to fix."""
from __future__ import annotations

import re
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ... import words
from ...aws import capacity, catalog, images, network, runstore, types
from ...aws.session import AWS_ERRORS
from ...errors import Ec2GpuError, ExitCode
from ...remote import sync
from ...sandbox import sshd

if TYPE_CHECKING:
    from ...aws.session import Aws
    from ...settings import Settings

#: what a check's function returns: (ok, detail) or (ok, detail, fix); ok None: could not tell;
#: ok True with a fix: a warning (runs work, better with the fix; never fails `doctor`)
Outcome = tuple[bool | None, str] | tuple[bool | None, str, str]


@dataclass
class Check:
    """One line of the report. ``ok`` None means "could not tell" (not a failure); ``ok`` True with
    a ``fix`` is a warning: runs work, and work better with the fix (``warning``)."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""

    @property
    def warning(self) -> bool:
        """Whether the check passed with something to fix (not a failure: exit_code ignores it)."""
        return self.ok is True and bool(self.fix)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _run(name: str, fn: Callable[[], Outcome]) -> Check:
    """Call ``fn() -> (ok, detail[, fix])``; an Ec2GpuError or AWS error becomes a failed check."""
    try:
        ok, detail, *fix = fn()
        return Check(name, ok, detail, fix[0] if fix else "")
    except Ec2GpuError as exc:
        return Check(name, False, exc.message, exc.hint)
    except AWS_ERRORS as exc:
        return Check(name, False, str(exc).splitlines()[0][:200], "see docs/iam-policy.json and docs/troubleshooting.md")


def _spot_role(aws: Aws, spot: bool, sandbox: bool = False) -> Outcome:
    """The spot service-linked role: present (ok), unreadable (unknown), missing in the sandbox (ok:
    its first spot request creates it, as EC2 does for a caller that may: sandbox/market.py), or
    missing on AWS (a failure only when --spot is asked for), with the command that creates it."""
    exists = capacity.spot_role_exists(aws.client("iam"))
    if exists:
        return True, f"{capacity.SPOT_ROLE} exists"
    if exists is None:
        return None, f"could not read the role {capacity.SPOT_ROLE} (iam:GetRole, docs/iam-policy.json)"
    if sandbox:
        return True, (f"{capacity.SPOT_ROLE} does not exist yet: the sandbox's first spot request creates it, as EC2 "
                      "does for credentials that may (iam:CreateServiceLinkedRole)")
    return (False if spot else None), (
        f"{capacity.SPOT_ROLE} does not exist yet: the account's first spot request creates it only if these "
        "credentials may (iam:CreateServiceLinkedRole)" + ("" if spot else "; needed for --spot only")), \
        capacity.SPOT_ROLE_COMMAND


def run_store(aws: Aws, settings: Settings) -> Outcome:
    """The run store of detached runs (aws/runstore.py), read only, never created here: not made
    yet (ok: the first detached run makes it), made with every setting ec2gpu gives it (ok), or
    what it lacks (a failure), with the fix."""
    bucket = runstore.bucket_name(aws.check_credentials()["Account"], aws.region)
    s3 = aws.client("s3")
    if not runstore.exists(s3, bucket):
        return True, f"s3://{bucket} not created yet (made on the first detached run)"
    problems = runstore.check(s3, bucket, settings.run_store_expire_days)
    if problems:
        return False, f"s3://{bucket}: " + "; ".join(problems), \
            ("the next detached run of credentials that may change the bucket's settings (an administrator's: "
             "docs/iam-policy.json gives users none) sets them again (aws/runstore.ensure); docs/security.md, "
             "'The run store'")
    return True, (f"s3://{bucket}: public access blocked, SSE-S3, TLS only, runs/ expire after "
                  f"{settings.run_store_expire_days} days")


def _type_facts(aws: Aws, instance_type: str) -> Outcome:
    """The instance type's GPUs and vCPUs as EC2 describes them (aws/types.py), and from where."""
    f = types.facts(aws.ec2, instance_type)
    return True, f"{f.name}: {f.gpu_count}x {f.gpu}, {f.vcpus} vCPUs ({f.source})"


def run_checks(aws: Aws, settings: Settings, instance_type: str, spot: bool, sandbox: bool) -> list[Check]:
    """All checks for launching ``instance_type`` with ``aws`` (an aws.session.Aws) and ``settings``."""
    checks = [_run("credentials", lambda: (True, aws.check_credentials()["Arn"]))]
    if checks[0].ok is False:
        return checks  # nothing else can be asked without them
    ec2 = aws.ec2

    def vpc() -> Outcome:
        vpc_id = network.default_vpc(ec2)
        subnets = capacity.default_subnets(ec2)
        zones = capacity.zones_offering(ec2, instance_type)
        usable = [z for z in zones if z in subnets]
        if not usable:
            return False, f"{vpc_id}: no default subnet in a zone offering {instance_type}", \
                "create default subnets: aws ec2 create-default-subnet --availability-zone ZONE"
        return True, f"{vpc_id}, default subnets in {len(subnets)} zones; {instance_type} offered in {', '.join(usable)}"

    def quota() -> Outcome:
        notes: list[str] = []
        got = capacity.check_quota(aws.client("service-quotas"), ec2, instance_type, spot, log=notes.append)
        if got is None:
            return None, notes[0] if notes else f"{instance_type} is not counted by the G and VT quotas"
        return True, f"{got['quota']}: {got['value']:g} vCPUs, {got['in_use']} in use, {got['needed']} needed"

    def ami() -> Outcome:
        a = images.resolve_ami(aws.client("ssm"), ec2)
        return True, f"{a['ImageId']} {a['Name']}: {a['why']} (via {a['source'].split(':')[0]})"

    def price() -> Outcome:
        p = catalog.on_demand_price(instance_type, aws.region, settings.home)
        detail = f"{instance_type} on-demand {p.usd_per_hour} USD/h ({p.source})"
        if p.usd_per_hour is not None:
            return True, detail
        return False, detail, f"ec2gpu prices --refresh --region {aws.region}"

    checks += [
        _run("region", lambda: (True, f"{aws.region}" + (" (sandbox)" if sandbox else ""))),
        _run("instance type", lambda: _type_facts(aws, instance_type)),
        _run("default VPC", vpc),
        _run("GPU vCPU quota", quota),
        _run("AMI", ami),
        _run("spot role", lambda: _spot_role(aws, spot, sandbox)),
        _run("run store", lambda: run_store(aws, settings)),
        _run("your IP", lambda: (True, f"SSH will be allowed from {network.ssh_cidr(None, aws.checkip_url)} only")),
        _run("price", price),
        _run("ssh client", lambda: (bool(shutil.which("ssh")), shutil.which("ssh") or "no `ssh` on PATH",
                                    "install OpenSSH's client (apt-get install openssh-client) for `ec2gpu ssh`")),
        _run("rsync", rsync_check),
        _run("key files", lambda: key_files(settings.keys_dir)),
    ]
    if sandbox:
        checks.append(_run("sshd (sandbox)", lambda: (True, sshd.sshd_binary())))
    return checks


#: The first rsync that checks the file list a sender returns against the names asked for
#: (CVE-2022-29154; rsync's NEWS for 3.2.5: https://download.samba.org/pub/rsync/NEWS#3.2.5)
RSYNC_CHECKS_NAMES = (3, 2, 5)


def rsync_check(local: Callable[[], tuple[str | None, str | None]] | None = None) -> Outcome:
    """(ok, detail[, fix]) of the rsync on this machine (``local() -> (path, version)``, default
    remote/sync.local_rsync): missing is a warning, never a failure (every run works through the
    SFTP fallback, sending the whole workdir every time: remote/sync.py), one older than
    RSYNC_CHECKS_NAMES is said (docs/security.md)."""
    path, version = (local or sync.local_rsync)()
    if path is None:
        return True, f"no rsync on this machine: runs work, sending workdirs over SFTP ({sync.WITHOUT_RSYNC})", \
            "install rsync (apt-get install rsync; brew install rsync)"
    parts = tuple(int(x) for x in re.findall(r"\d+", version or "")[:3])
    old = bool(parts) and parts < RSYNC_CHECKS_NAMES
    return True, (f"rsync {version or '(version not reported)'} at {path}: workdirs go up by rsync, only what "
                  "changed" + ("; older than 3.2.5: it does not check the names an instance sends back "
                               "(CVE-2022-29154, docs/security.md)" if old else ""))


def exit_code(checks: list[Check]) -> int:
    """`doctor`'s exit code (pure): 0 when no check failed, 3 (ExitCode.AWS) when the credentials
    failed (the README: without credentials every command exits 3), else 1."""
    if not any(c.ok is False for c in checks):
        return ExitCode.SUCCESS
    return ExitCode.AWS if any(c.name == "credentials" and c.ok is False for c in checks) else ExitCode.ERROR


def key_files(keys_dir: Path) -> Outcome:
    """(ok, detail, fix): every private key under ``keys_dir`` is mode 0600."""
    keys = sorted(keys_dir.glob("*.pem")) if keys_dir.is_dir() else []
    loose = [k for k in keys if stat.S_IMODE(k.stat().st_mode) & 0o077]
    if loose:
        return False, f"{words.count(len(loose), 'key file')} readable by others: {', '.join(k.name for k in loose)}", \
            f"chmod 600 {' '.join(str(k) for k in loose)}"
    return True, f"{words.count(len(keys), 'key file')} in {keys_dir}, all 0600" if keys else f"none yet ({keys_dir})"
