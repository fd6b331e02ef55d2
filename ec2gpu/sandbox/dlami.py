"""The sandbox's Deep Learning AMIs, found the way aws/images.py finds the real ones.

Two stand-in images (the Ubuntu 22.04 and 24.04 PyTorch DLAMIs) in moto's image list, and the SSM
public parameters that name them under /aws/service/deeplearning/ami/x86_64/, which moto does not
have; and Canonical's Ubuntu 24.04 under its parameter (`ec2gpu image bake --from ubuntu-24.04`).
An instance launched from either is the same sandbox instance: what differs is only which
one the tool picks, and why.
"""
from __future__ import annotations

from ..aws.images import DLAMI_PATH, UBUNTU_2404_PARAMETER

OWNER = "898082745236"  # the account that publishes the DLAMIs
CANONICAL = "099720109477"  # Canonical's account (its Ubuntu images)


def _image(ami_id: str, torch: str, ubuntu: str, date: str) -> dict:
    return {
        "ami_id": ami_id, "state": "available", "public": True, "owner_id": OWNER,
        "image_location": f"amazon/ec2gpu-sandbox-dlami-{ubuntu}", "sriov": "simple", "root_device_type": "ebs",
        "root_device_name": "/dev/sda1", "image_type": "machine", "platform": None, "architecture": "x86_64",
        "description": f"ec2gpu sandbox stand-in for the Deep Learning OSS Nvidia Driver AMI (PyTorch {torch}, "
                       f"Ubuntu {ubuntu})",
        "name": f"Deep Learning OSS Nvidia Driver AMI GPU PyTorch {torch} (Ubuntu {ubuntu}) {date}",
        "virtualization_type": "hvm", "hypervisor": "xen", "creation_date": f"{date[:4]}-{date[4:6]}-{date[6:]}T00:00:00.000Z",
    }


IMAGES = {
    f"{DLAMI_PATH}/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id":
        _image("ami-0ec29b0d1a0000001", "2.7", "22.04", "20251101"),
    f"{DLAMI_PATH}/oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id":
        _image("ami-0ec29b0d1a0002404", "2.9", "24.04", "20261101"),
    UBUNTU_2404_PARAMETER: {
        **_image("ami-0ca0ca1ca12404000", "-", "24.04", "20261101"), "owner_id": CANONICAL,
        "image_location": "amazon/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261101",
        "name": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261101",
        "description": "ec2gpu sandbox stand-in for Canonical, Ubuntu, 24.04, amd64 noble image (no NVIDIA driver)"},
}


def install_parameters() -> None:
    """Patch moto's SSM (in the daemon) so every region has the DLAMI parameters above."""
    from collections import defaultdict

    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter, ParameterDict

    original = ParameterDict._check_loading_status

    def check_loading_status(self, key: str) -> None:
        original(self, key)
        if key.startswith(("/aws/service/deeplearning", "/aws/service/canonical")) and not getattr(self, "_ec2gpu_dlami", False):
            self._ec2gpu_dlami = True
            for name, image in IMAGES.items():
                defaultdict.__getitem__(self, name).append(Parameter(  # type: ignore[abstract]  # moto makes them so; not self[name]: that would recurse
                    account_id=self.account_id, name=name, value=image["ami_id"], parameter_type="String",
                    description=None, allowed_pattern=None, keyid=None, last_modified_date=utcnow(), version=1,
                    data_type="aws:ec2:image"))

    ParameterDict._check_loading_status = check_loading_status
