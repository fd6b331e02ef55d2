"""AMI resolution: the AWS Deep Learning AMI (PyTorch, Ubuntu) through SSM public parameters.

Parameter names: https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html
When no parameter resolves (older partitions, permissions), the newest image owned by Amazon
whose name matches the DLAMI pattern is used. ``--ami`` overrides both.
"""
from __future__ import annotations

import botocore.exceptions

from ..errors import AwsError

SSM_PARAMETERS = (
    "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id",
    "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.6-ubuntu-22.04/latest/ami-id",
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
)
NAME_PATTERNS = (
    "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *",
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
)


def resolve_ami(ssm, ec2, override: str | None = None) -> dict:
    """Return the image to launch: {'ImageId', 'Name', 'RootDeviceName', 'source'}.

    Order: ``override``, the SSM parameters above, then describe_images by name (owner amazon,
    newest CreationDate). Raises AwsError when none is found.
    """
    image_id, source = override, "--ami"
    if not image_id:
        for name in SSM_PARAMETERS:
            try:
                image_id = ssm.get_parameter(Name=name)["Parameter"]["Value"]
                source = f"ssm:{name}"
                break
            except botocore.exceptions.ClientError:
                continue
    if image_id:
        try:
            images = ec2.describe_images(ImageIds=[image_id])["Images"]
        except botocore.exceptions.ClientError as exc:
            raise AwsError(f"AMI {image_id} cannot be described: {exc}", "check --ami and the region")
        if not images:
            raise AwsError(f"AMI {image_id} does not exist in this region", "check --ami and the region")
        return _pick(images[0], source)
    for pattern in NAME_PATTERNS:
        images = ec2.describe_images(Owners=["amazon"], Filters=[
            {"Name": "name", "Values": [pattern]}, {"Name": "state", "Values": ["available"]},
            {"Name": "architecture", "Values": ["x86_64"]}])["Images"]
        if images:
            newest = max(images, key=lambda i: i.get("CreationDate", ""))
            return _pick(newest, f"describe_images:{pattern}")
    raise AwsError("no AWS Deep Learning AMI found in this region",
                   "pass --ami ami-... (an Ubuntu image with the NVIDIA driver)")


def _pick(image: dict, source: str) -> dict:
    return {"ImageId": image["ImageId"], "Name": image.get("Name", ""),
            "RootDeviceName": image.get("RootDeviceName", "/dev/sda1"), "source": source}
