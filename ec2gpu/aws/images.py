"""AMI resolution: the AWS Deep Learning AMI (PyTorch, Ubuntu) through SSM public parameters.

Parameter names: /aws/service/deeplearning/ami/x86_64/<ami type>/latest/ami-id, where the AMI type
is the DLAMI's name without "deep learning ami", e.g.
``oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-24.04`` (https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html).
The newest PyTorch DLAMI for Ubuntu 24.04 is preferred: the Ubuntu 22.04 line has passed its end
of patching (DLAMI support policy, https://docs.aws.amazon.com/dlami/latest/devguide/support-policy.html)
and is used only where no 24.04 image is published, and then said. The parameters are listed with
GetParametersByPath, so the newest is found whatever it is; where that call is refused, the
names of FALLBACK_TORCH are tried, newest first, and past the newest one that answers the next
versions too (``_by_name``), then the newest image owned by Amazon whose name matches.
``--ami`` overrides all of it.
"""
from __future__ import annotations

import re
from typing import Any

import botocore.exceptions

from ..errors import AwsError
from .session import Client, Item

DLAMI_PATH = "/aws/service/deeplearning/ami/x86_64"
#: Ubuntu releases in order of preference, with why a later one is only a fallback
UBUNTU_RELEASES = ("24.04", "22.04")
FALLBACK_WHY = {"22.04": "past its end of patching; used because this region publishes no Ubuntu 24.04 PyTorch DLAMI"}
_PYTORCH = re.compile(rf"^{DLAMI_PATH}/oss-nvidia-driver-gpu-pytorch-(\d+)\.(\d+)-ubuntu-(\d+\.\d+)/latest/ami-id$")
#: PyTorch versions of the DLAMI tried by name, newest first, when GetParametersByPath is refused:
#: those of the DLAMI developer guide's release notes up to "Deep Learning ARM64 AMI OSS Nvidia
#: Driver GPU PyTorch 2.11 (Ubuntu 24.04) 20261009" (page aws-deep-learning-ami-gpupt211ossarm64-
#: ul2404-2026-10-09) and "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.11 (Amazon Linux 2023)
#: 20260905" (aws-deep-learning-ami-gpupt211oss-al2023-2026-09-07), read 2026-11. A newer release
#: is still found: when the first of them answers, the versions after it are tried too.
FALLBACK_TORCH = ("2.11", "2.10", "2.9", "2.8", "2.7", "2.6")
#: at most this many versions past FALLBACK_TORCH[0] are tried (next minor, else next major's .0)
MAX_NEWER = 12


def parameter_name(torch: str, ubuntu: str) -> str:
    """The SSM public parameter of the x86_64 PyTorch DLAMI ``torch`` for Ubuntu ``ubuntu`` (pure)."""
    return f"{DLAMI_PATH}/oss-nvidia-driver-gpu-pytorch-{torch}-ubuntu-{ubuntu}/latest/ami-id"


#: tried one by one when GetParametersByPath is refused
SSM_PARAMETERS = tuple(parameter_name(torch, ubuntu) for ubuntu in UBUNTU_RELEASES for torch in FALLBACK_TORCH)
NAME_PATTERNS = tuple(f"Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu {u}) *" for u in UBUNTU_RELEASES)


def described(ec2: Client, **params: Any) -> list[Item]:
    """Every image DescribeImages answers for ``params``, over all its pages (boto3's paginator:
    EC2 pages DescribeImages with NextToken when the answer is long)."""
    return [i for page in ec2.get_paginator("describe_images").paginate(**params) for i in page["Images"]]


def pick_parameter(parameters: dict[str, str]) -> tuple[str, str, str] | None:
    """From {parameter name: AMI id}, the PyTorch DLAMI to use (pure): (name, AMI id, Ubuntu
    release) for the first release of UBUNTU_RELEASES that has one, newest PyTorch first; None."""
    found = []
    for name, value in parameters.items():
        m = _PYTORCH.fullmatch(name)
        if m:
            found.append(((int(m.group(1)), int(m.group(2))), m.group(3), name, value))
    for release in UBUNTU_RELEASES:
        mine = sorted((f for f in found if f[1] == release), reverse=True)
        if mine:
            return mine[0][2], mine[0][3], release
    return None


def _by_path(ssm: Client) -> dict[str, str] | None:
    """Every DLAMI parameter of the region ({name: AMI id}), or None when the call is refused."""
    try:
        pages = ssm.get_paginator("get_parameters_by_path").paginate(Path=DLAMI_PATH, Recursive=True)
        return {p["Name"]: p["Value"] for page in pages for p in page.get("Parameters", [])}
    except botocore.exceptions.ClientError:
        return None


def _get(ssm: Client, name: str) -> str | None:
    try:
        value: str = ssm.get_parameter(Name=name)["Parameter"]["Value"]
        return value
    except botocore.exceptions.ClientError:
        return None


def _by_name(ssm: Client) -> tuple[str, str, str] | None:
    """SSM_PARAMETERS one by one, newest first (as pick_parameter); when the newest listed version
    answers, the versions after it are tried until one is missing (``_newer``)."""
    for name in SSM_PARAMETERS:
        value = _get(ssm, name)
        if value is None:
            continue
        found = {name: value}
        m = _PYTORCH.fullmatch(name)
        assert m is not None  # every name of SSM_PARAMETERS is a parameter_name, which _PYTORCH matches
        if f"{m.group(1)}.{m.group(2)}" == FALLBACK_TORCH[0]:
            found.update(_newer(ssm, int(m.group(1)), int(m.group(2)), m.group(3)))
        return pick_parameter(found)
    return None


def _newer(ssm: Client, major: int, minor: int, ubuntu: str) -> dict[str, str]:
    """The parameters of the PyTorch DLAMIs after ``major.minor`` for ``ubuntu`` ({name: AMI id}):
    the next minor version while one answers, else the next major version's .0; MAX_NEWER at most."""
    found = {}
    for _ in range(MAX_NEWER):
        for candidate in ((major, minor + 1), (major + 1, 0)):
            value = _get(ssm, parameter_name(f"{candidate[0]}.{candidate[1]}", ubuntu))
            if value is not None:
                found[parameter_name(f"{candidate[0]}.{candidate[1]}", ubuntu)] = value
                major, minor = candidate
                break
        else:
            return found
    return found


def resolve_ami(ssm: Client, ec2: Client, override: str | None = None) -> dict[str, str]:
    """Return the image to launch: {'ImageId', 'Name', 'RootDeviceName', 'source', 'why'}.

    Order: ``override``, the newest Ubuntu 24.04 PyTorch DLAMI among the SSM parameters (then
    22.04), then describe_images by name (owner amazon, newest CreationDate, 24.04 first). ``why``
    says in words which image this is and why it was chosen. Raises AwsError when none is found.
    """
    if override:
        return _describe(ec2, override, "--ami", "given with --ami")
    params = _by_path(ssm)
    picked = pick_parameter(params) if params is not None else _by_name(ssm)
    if picked:
        name, image_id, release = picked
        why = f"newest PyTorch DLAMI for Ubuntu {release}" + (f" ({FALLBACK_WHY[release]})" if release in FALLBACK_WHY else "")
        return _describe(ec2, image_id, f"ssm:{name}", why)
    for pattern, release in zip(NAME_PATTERNS, UBUNTU_RELEASES, strict=True):
        images = described(ec2, Owners=["amazon"], Filters=[
            {"Name": "name", "Values": [pattern]}, {"Name": "state", "Values": ["available"]},
            {"Name": "architecture", "Values": ["x86_64"]}])
        if images:
            newest = max(images, key=lambda i: i.get("CreationDate", ""))
            why = f"newest image named like the Ubuntu {release} PyTorch DLAMI (no SSM parameter could be read)" + \
                (f"; {FALLBACK_WHY[release]}" if release in FALLBACK_WHY else "")
            return _pick(newest, f"describe_images:{pattern}", why)
    raise AwsError("no AWS Deep Learning AMI found in this region",
                   "pass --ami ami-... (an Ubuntu image with the NVIDIA driver)")


def _describe(ec2: Client, image_id: str, source: str, why: str) -> dict[str, str]:
    try:
        images = described(ec2, ImageIds=[image_id])
    except botocore.exceptions.ClientError as exc:
        raise AwsError(f"AMI {image_id} cannot be described: {exc}", "check --ami and the region")
    if not images:
        raise AwsError(f"AMI {image_id} does not exist in this region", "check --ami and the region")
    return _pick(images[0], source, why)


def _pick(image: Item, source: str, why: str) -> dict[str, str]:
    return {"ImageId": image["ImageId"], "Name": image.get("Name", ""),
            "RootDeviceName": image.get("RootDeviceName", "/dev/sda1"), "source": source, "why": why}


#: Canonical's SSM public parameter for its newest Ubuntu 24.04 server image (amd64, gp3 root):
#: https://documentation.ubuntu.com/aws/aws-how-to/instances/find-ubuntu-images/
UBUNTU_2404_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
#: what `ec2gpu image bake --from` accepts
BASES = ("dlami", "ubuntu-24.04")


def resolve_base(ssm: Client, ec2: Client, base: str, override: str | None = None) -> dict[str, str]:
    """The image a bake starts from (as resolve_ami returns it): the PyTorch DLAMI for "dlami",
    Canonical's Ubuntu 24.04 (no NVIDIA driver, no torch) for "ubuntu-24.04". Raises AwsError when
    the region has none."""
    if override or base == "dlami":
        return resolve_ami(ssm, ec2, override)
    try:
        image_id = ssm.get_parameter(Name=UBUNTU_2404_PARAMETER)["Parameter"]["Value"]
    except botocore.exceptions.ClientError as exc:
        raise AwsError(f"Canonical's Ubuntu 24.04 image cannot be found ({UBUNTU_2404_PARAMETER}: {exc})",
                       "pass --ami ami-... (an Ubuntu 24.04 image), or bake --from dlami")
    return _describe(ec2, image_id, f"ssm:{UBUNTU_2404_PARAMETER}", "Canonical's Ubuntu 24.04 server image")
