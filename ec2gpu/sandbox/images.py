"""The sandbox's machine images and reboots: CreateImage keeps what the builder's disk held, an
instance launched from that image starts with it, and RebootInstances reboots.

moto registers an image without any content, refuses a "snapshot" TagSpecification
(NotImplementedError), gives the snapshot a 15 GiB volume, makes the image available at once, and
does nothing on RebootInstances. Here (in the daemon only):

- CreateImage copies the builder instance's home (a sandbox instance's disk: sshd.py) to
  STATE_DIR/images/<AMI id>/home, tags the image's snapshot as EC2 does with TagSpecifications,
  gives it the builder's root volume size, and, in the AWS-like mode, keeps the image ``pending``
  for a few seconds as EC2 does while it snapshots the volume. EC2 reboots the builder first
  unless NoReboot; the sandbox copies at once (the builder's files are all written by then).
- An instance whose image has a stored home starts with a copy of it (``seed_home``); the stored
  home goes when its image is deregistered.
- DeregisterImage with DeleteAssociatedSnapshots=True deletes the image's snapshots and answers
  DeleteSnapshotResults, as EC2 does (moto ignores the parameter; botocore's ec2 model,
  DeregisterImage; https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeregisterImage.html).
- RebootInstances marks the instance; the daemon stops its sshd and processes and starts them
  again (``rebooted``) with a new boot id in $EC2GPU_BOOT_ID_FILE (/proc/sys/kernel/random/boot_id
  on a real machine), which is how the controller sees that the reboot happened.
"""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

_reboots: set[str] = set()
_lock = threading.Lock()


def image_home(state_dir: Path, ami_id: str) -> Path:
    return state_dir / "images" / ami_id / "home"


def install(state_dir: Path, pending_s: float = 0.0) -> None:
    """Patch moto's CreateImage, DeregisterImage and Instance.reboot (after moto is imported)."""
    from moto.ec2.models.amis import AmiBackend
    from moto.ec2.models.instances import Instance
    from moto.ec2.responses.amis import AmisResponse

    create_image, deregister_image, reboot = AmiBackend.create_image, AmiBackend.deregister_image, Instance.reboot

    def create(self, instance_id, name, description, tag_specifications):
        image_specs = [s for s in tag_specifications if s["ResourceType"] != "snapshot"]
        snapshot_tags = [t for s in tag_specifications if s["ResourceType"] == "snapshot" for t in s["Tags"]]
        ami = create_image(self, instance_id, name, description, image_specs)
        for tag in snapshot_tags:
            ami.ebs_snapshot.add_tag(tag["Key"], tag["Value"])
        instance = self.get_instance(instance_id)
        root = instance.block_device_mapping.get(instance.root_device_name)
        if root is not None:
            ami.ebs_snapshot.volume.size = self.get_volume(root.volume_id).size
        source = state_dir / "instances" / instance_id / "home"
        if source.is_dir():
            shutil.copytree(source, image_home(state_dir, ami.id), symlinks=True)
        if pending_s > 0:
            ami.state = "pending"
            timer = threading.Timer(pending_s, setattr, args=(ami, "state", "available"))
            timer.daemon = True
            timer.start()
        return ami

    def deregister(self, ami_id):
        deregister_image(self, ami_id)
        shutil.rmtree(image_home(state_dir, ami_id).parent, ignore_errors=True)

    def reboot_marked(self):
        reboot(self)
        with _lock:
            _reboots.add(self.id)

    AmiBackend.create_image = create
    AmiBackend.deregister_image = deregister
    Instance.reboot = reboot_marked
    AmisResponse.deregister_image = deregister_with_snapshots


def deregister_with_snapshots(self):
    """moto's DeregisterImage response, with DeleteAssociatedSnapshots: the image's snapshots are
    deleted after it, each reported with its ReturnCode (success, or client-error when EC2 would
    refuse it, e.g. one another image still uses)."""
    from moto.core.exceptions import ServiceException
    from moto.core.responses import ActionResult

    ami_id = self._get_param("ImageId")
    delete = self._get_bool_param("DeleteAssociatedSnapshots", False)
    self.error_on_dryrun()
    ami = self.ec2_backend.amis.get(ami_id)
    snapshot = getattr(ami, "ebs_snapshot", None)
    self.ec2_backend.deregister_image(ami_id)
    result: dict = {"Return": True}
    if delete:
        result["DeleteSnapshotResults"] = []
        for sid in [snapshot.id] if snapshot is not None else []:
            try:
                self.ec2_backend.delete_snapshot(sid)
                code = "success"
            except ServiceException:  # EC2 refused it (moto's errors): the snapshot stays, as on EC2
                code = "client-error"
            result["DeleteSnapshotResults"].append({"SnapshotId": sid, "ReturnCode": code})
    return ActionResult(result)


def seed_home(state_dir: Path, ami_id: str, home: Path) -> bool:
    """Give a new instance's ``home`` the files of the image it launched from, if that image was
    made by CreateImage here; whether it was."""
    stored = image_home(state_dir, ami_id)
    if not stored.is_dir() or home.exists():
        return False
    shutil.copytree(stored, home, symlinks=True)
    return True


def rebooted() -> set[str]:
    """The instances RebootInstances was called for since the last call (and forget them)."""
    with _lock:
        out = set(_reboots)
        _reboots.clear()
    return out
