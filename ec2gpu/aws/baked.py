"""Baked images: AMIs the tool made from a builder instance (`ec2gpu image bake`), found by tag.

An image and its EBS snapshots carry the run's tags (ec2gpu:run, ec2gpu:owner, Name) and:
ec2gpu:image (its name), ec2gpu:setup-hash (sha256 of the task's setup text: what a run matches
on), ec2gpu:task, ec2gpu:base (dlami or ubuntu-24.04) and ec2gpu:base-image (the AMI it was made
from), ec2gpu:torch, ec2gpu:cuda, ec2gpu:driver, and ec2gpu:bake, "incomplete" from CreateImage
until the image is available, then "complete". Only complete images are used or listed as
images; `ec2gpu cleanup` and a run's teardown remove incomplete ones with their snapshots.

CreateImage applies TagSpecifications to the image and to the snapshots it creates
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateImage.html), so a snapshot is
found by its run's tag even when the CreateImage response never arrived (Ctrl-C during the call).
Deregistering an image leaves its snapshots (and their bill) behind; they are deleted after it
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/deregister-ami.html).
"""
from __future__ import annotations

import botocore.exceptions

from ..errors import AwsError, WaitTimeout
from . import tags as T

IMAGE = "ec2gpu:image"
SETUP_HASH = "ec2gpu:setup-hash"
TASK = "ec2gpu:task"
BASE = "ec2gpu:base"
BASE_IMAGE = "ec2gpu:base-image"
BAKE = "ec2gpu:bake"  # "incomplete" | "complete"
VERSIONS = {"torch_version": "ec2gpu:torch", "cuda_version": "ec2gpu:cuda", "driver_version": "ec2gpu:driver"}
#: EBS snapshot storage, standard tier, USD per GB-month (us-east-1, https://aws.amazon.com/ebs/pricing/,
#: as of 2026-11). Billed for the blocks stored, not the volume's size.
SNAPSHOT_USD_PER_GB_MONTH = 0.05


def image_tags(run_id: str, owner: str, name: str, setup_hash: str, task: str, base: str, base_image: str,
               versions: dict) -> list[dict]:
    """The tags of a baked image and its snapshots, as an EC2 Tags list (pure); ``versions`` is the
    instance's setup.json (torch_version, cuda_version, driver_version; None values are left out)."""
    extra = {IMAGE: name, SETUP_HASH: setup_hash, TASK: task, BASE: base, BASE_IMAGE: base_image, BAKE: "incomplete"}
    extra.update({tag: str(versions[key]) for key, tag in VERSIONS.items() if versions.get(key)})
    return T.tags(run_id, owner, name) + [{"Key": k, "Value": v} for k, v in extra.items()]


def create(ec2, instance_id: str, name: str, description: str, tag_list: list[dict]) -> str:
    """CreateImage of ``instance_id`` (EC2 reboots it first, so the file system is consistent: the
    default of NoReboot=false), the image and its snapshots tagged with ``tag_list``; its AMI id."""
    specs = [{"ResourceType": kind, "Tags": tag_list} for kind in ("image", "snapshot")]
    return ec2.create_image(InstanceId=instance_id, Name=name, Description=description[:255],
                            TagSpecifications=specs)["ImageId"]


def wait_available(ec2, image_id: str, timeout_s: float = 1800, delay_s: float = 15) -> dict:
    """Wait (boto3's image_available waiter) until the image is available; its description.

    AWS takes minutes per image (the snapshot of the root volume); 30 min bounds it. Raises
    WaitTimeout past ``timeout_s``, AwsError when the image failed.
    """
    try:
        ec2.get_waiter("image_available").wait(ImageIds=[image_id], WaiterConfig={
            "Delay": delay_s, "MaxAttempts": max(1, int(timeout_s // max(delay_s, 0.001)))})
    except botocore.exceptions.WaiterError as exc:
        images = (exc.last_response or {}).get("Images") or [{}]
        state = images[0].get("State")
        if state == "failed":
            reason = (images[0].get("StateReason") or {}).get("Message", "no reason given")
            raise AwsError(f"image {image_id} failed: {reason}", "bake again; nothing of it is kept")
        raise WaitTimeout(f"image {image_id} not available after {timeout_s:.0f} s (state {state})",
                          "bake again later; the half-made image and its snapshots were removed")
    return ec2.describe_images(ImageIds=[image_id])["Images"][0]


def snapshot_ids(image: dict) -> list[str]:
    """The EBS snapshots an image's block devices come from (pure)."""
    return [m["Ebs"]["SnapshotId"] for m in image.get("BlockDeviceMappings", []) if m.get("Ebs", {}).get("SnapshotId")]


def mark_complete(ec2, image: dict) -> None:
    """Tag the image and its snapshots ec2gpu:bake=complete: from now on runs may use it."""
    ec2.create_tags(Resources=[image["ImageId"], *snapshot_ids(image)], Tags=[{"Key": BAKE, "Value": "complete"}])


def images(ec2, run_id: str | None = None, complete: bool | None = True) -> list[dict]:
    """This account's images made by the tool in the client's region, newest first; one run's, and
    only complete (True), only incomplete (False) or all (None)."""
    filters = [{"Name": "tag-key", "Values": [IMAGE]}]
    if run_id:
        filters.append({"Name": f"tag:{T.RUN}", "Values": [run_id]})
    found = ec2.describe_images(Owners=["self"], Filters=filters)["Images"]
    if complete is not None:
        found = [i for i in found if (T.as_dict(i.get("Tags")).get(BAKE) == "complete") == complete]
    return sorted(found, key=lambda i: i.get("CreationDate", ""), reverse=True)


def newest_for(ec2, setup_hash: str) -> dict | None:
    """The newest complete, available image baked for a setup with this hash, or None."""
    found = ec2.describe_images(Owners=["self"], Filters=[
        {"Name": f"tag:{SETUP_HASH}", "Values": [setup_hash]}, {"Name": f"tag:{BAKE}", "Values": ["complete"]},
        {"Name": "state", "Values": ["available"]}])["Images"]
    return max(found, key=lambda i: i.get("CreationDate", ""), default=None)


def snapshots(ec2, run_id: str | None = None) -> list[dict]:
    """Snapshots tagged by an image bake (optionally one run's)."""
    filters = [{"Name": "tag-key", "Values": [IMAGE]}]
    if run_id:
        filters.append({"Name": f"tag:{T.RUN}", "Values": [run_id]})
    pages = ec2.get_paginator("describe_snapshots").paginate(OwnerIds=["self"], Filters=filters)
    return [s for page in pages for s in page["Snapshots"]]


def find(ec2, ref: str) -> dict | None:
    """A complete or incomplete image of the tool by AMI id or by name (the newest of that name)."""
    for image in images(ec2, complete=None):
        if ref in (image["ImageId"], T.as_dict(image.get("Tags")).get(IMAGE)):
            return image
    return None


def delete(ec2, image: dict, log=lambda msg: None) -> list[str]:
    """Deregister ``image`` and delete its snapshots (those it names and those tagged with its
    run); return the snapshot ids deleted. Snapshots are deleted after the image: EC2 refuses to
    delete one an image still uses (InvalidSnapshot.InUse)."""
    run_id = T.as_dict(image.get("Tags")).get(T.RUN)
    deregister(ec2, image["ImageId"], log)
    ids = set(snapshot_ids(image))
    if run_id:  # a bake run makes one image: every snapshot of the run is this image's
        ids |= {s["SnapshotId"] for s in snapshots(ec2, run_id)}
    return delete_snapshots(ec2, sorted(ids), log)


def delete_snapshots(ec2, ids: list[str], log=lambda msg: None) -> list[str]:
    """Delete these snapshots (one already gone counts as deleted); the ids deleted."""
    done = []
    for sid in ids:
        try:
            ec2.delete_snapshot(SnapshotId=sid)
        except botocore.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] != "InvalidSnapshot.NotFound":
                raise
        log(f"deleted snapshot {sid}")
        done.append(sid)
    return done


def incomplete_snapshots(ec2, run_id: str | None = None) -> list[dict]:
    """Snapshots of bakes that did not complete (one run's, or all): tagged ec2gpu:bake=incomplete
    and held by no complete image. An interrupted CreateImage leaves these."""
    held = {sid for image in images(ec2, complete=True) for sid in snapshot_ids(image)}
    return [s for s in snapshots(ec2, run_id) if s["SnapshotId"] not in held
            and T.as_dict(s.get("Tags")).get(BAKE) != "complete"]


def remove_incomplete(ec2, run_id: str | None = None, log=lambda msg: None) -> list[str]:
    """Deregister every incomplete image (one run's, or all), then delete the incomplete bakes'
    snapshots. Returns the ids removed (images, then snapshots). Complete images are never touched."""
    gone = []
    for image in images(ec2, run_id, complete=False):
        deregister(ec2, image["ImageId"], log)
        gone.append(image["ImageId"])
    return gone + delete_snapshots(ec2, [s["SnapshotId"] for s in incomplete_snapshots(ec2, run_id)], log)


def deregister(ec2, image_id: str, log=lambda msg: None) -> None:
    """DeregisterImage; one already gone counts as done."""
    try:
        ec2.deregister_image(ImageId=image_id)
        log(f"deregistered {image_id}")
    except botocore.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] not in ("InvalidAMIID.NotFound", "InvalidAMIID.Unavailable"):
            raise


def stored_gib(snapshot: dict) -> tuple[float, str]:
    """A snapshot's stored size in GiB and its basis (pure): FullSnapshotSizeInBytes where EC2
    reports it, else the source volume's size (an upper bound: a snapshot stores used blocks)."""
    full = snapshot.get("FullSnapshotSizeInBytes")
    if full:
        return full / 2**30, "stored bytes"
    return float(snapshot.get("VolumeSize") or 0), "volume size (upper bound)"


def listing(ec2) -> list[dict]:
    """Every complete baked image with what is inside and what its snapshots cost per month."""
    snaps = {s["SnapshotId"]: s for s in snapshots(ec2)}
    rows = []
    for image in images(ec2):
        tg = T.as_dict(image.get("Tags"))
        sizes = [stored_gib(snaps[s]) for s in snapshot_ids(image) if s in snaps]
        gib = sum(g for g, _ in sizes)
        rows.append({
            "name": tg.get(IMAGE), "image_id": image["ImageId"], "state": image.get("State"),
            "created": image.get("CreationDate"), "task": tg.get(TASK), "setup_hash": tg.get(SETUP_HASH),
            "base": tg.get(BASE), "base_image": tg.get(BASE_IMAGE), "run_id": tg.get(T.RUN),
            **{key.removesuffix("_version"): tg.get(tag) for key, tag in VERSIONS.items()},
            "snapshots": snapshot_ids(image), "snapshot_gib": round(gib, 2),
            "size_basis": sizes[0][1] if sizes else "no snapshot found",
            "usd_per_month": round(gib * SNAPSHOT_USD_PER_GB_MONTH, 4)})
    return rows
