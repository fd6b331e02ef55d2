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
An image is deregistered with DeleteAssociatedSnapshots=True: EC2 deletes its snapshots with it
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeregisterImage.html; botocore's ec2
model, DeregisterImage: DeleteAssociatedSnapshots, DeleteSnapshotResults). A snapshot deleted on
its own right after its image is deregistered can still answer InvalidSnapshot.InUse for a while
(the image's release is eventually consistent), so DeleteSnapshot retries that with bounded
backoff; and a bake's snapshot whose image is gone is removed by `ec2gpu cleanup` whatever its
ec2gpu:bake tag says.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import botocore.exceptions
import botocore.waiter

from ..errors import AwsError, WaitTimeout
from . import catalog
from . import tags
from .images import described as described_images
from .session import Client, Item, Log

IMAGE = "ec2gpu:image"
SETUP_HASH = "ec2gpu:setup-hash"


def setup_key(builtin: str | None, setup: str | None) -> str:
    """What a baked image is matched on (pure): sha256 of the built-in task's name (its pre-fetched
    data) and the task's setup text; the value of its SETUP_HASH tag."""
    import hashlib
    return hashlib.sha256(f"{builtin or ''}\n{setup or ''}".encode()).hexdigest()
TASK = "ec2gpu:task"
BASE = "ec2gpu:base"
BASE_IMAGE = "ec2gpu:base-image"
BAKE = "ec2gpu:bake"  # "incomplete" | "complete"
VERSIONS = {"torch_version": "ec2gpu:torch", "cuda_version": "ec2gpu:cuda", "driver_version": "ec2gpu:driver"}
#: EBS snapshot storage, standard tier, USD per GB-month in us-east-1 (catalog.EBS_USD_PER_GB_MONTH:
#: https://aws.amazon.com/ebs/pricing/), for the docs and tests; a listing prices its own region's
#: (catalog.ebs_price). Billed for the blocks stored, not the volume's size.
SNAPSHOT_USD_PER_GB_MONTH = catalog.EBS_USD_PER_GB_MONTH["us-east-1"]["snapshot"]
#: CreateImage's Name: "3-128 alphanumeric characters, parentheses (()), square brackets ([]), spaces
#: ( ), periods (.), slashes (/), dashes (-), single quotes ('), at-signs (@), or underscores(_)"
#: (Amazon EC2 API Reference, CreateImage, Request Parameters, Name; botocore's ec2 model: min 3,
#: max 128). Anything else is InvalidAMIName.Malformed.
AMI_NAME_MIN, AMI_NAME_MAX = 3, 128
_NOT_IN_AMI_NAME = re.compile(r"[^A-Za-z0-9()\[\] ./'@_-]")


def ami_name(stem: str, when: datetime) -> str:
    """The default name of a bake's image (pure): ``stem`` (the task's name, or its file's stem)
    with every character CreateImage refuses made '-', then '-' and ``when`` as YYYYmmdd-HHMMSS (AMI
    names are unique per account and region), cut to AMI_NAME_MAX; a stem with nothing left is "task".
    E.g. ("train+v2", 2026-11-22 18:49:50) -> "train-v2-20261122-184950"."""
    suffix = f"-{when:%Y%m%d-%H%M%S}"
    clean = _NOT_IN_AMI_NAME.sub("-", stem).strip(" -") or "task"
    return clean[:AMI_NAME_MAX - len(suffix)] + suffix


def check_ami_name(name: str) -> bool:
    """Whether CreateImage accepts ``name`` as an image's Name (pure)."""
    return AMI_NAME_MIN <= len(name) <= AMI_NAME_MAX and not _NOT_IN_AMI_NAME.search(name)


def image_tags(run_id: str, owner: str, name: str, setup_hash: str, task: str, base: str, base_image: str,
               versions: dict[str, Any]) -> list[dict[str, str]]:
    """The tags of a baked image and its snapshots, as an EC2 Tags list (pure); ``versions`` is the
    instance's setup.json (torch_version, cuda_version, driver_version; None values are left out)."""
    extra = {IMAGE: name, SETUP_HASH: setup_hash, TASK: task, BASE: base, BASE_IMAGE: base_image, BAKE: "incomplete"}
    extra.update({tag: str(versions[key]) for key, tag in VERSIONS.items() if versions.get(key)})
    return tags.tags(run_id, owner, name) + [{"Key": k, "Value": v} for k, v in extra.items()]


def create(ec2: Client, instance_id: str, name: str, description: str, tag_list: list[dict[str, str]]) -> str:
    """CreateImage of ``instance_id`` (EC2 reboots it first, so the file system is consistent: the
    default of NoReboot=false), the image and its snapshots tagged with ``tag_list``; its AMI id."""
    specs = [{"ResourceType": kind, "Tags": tag_list} for kind in ("image", "snapshot")]
    image_id: str = ec2.create_image(InstanceId=instance_id, Name=name, Description=description[:255],
                                     TagSpecifications=specs)["ImageId"]
    return image_id


#: botocore's ImageAvailable waiter (ec2 waiters-2.json: DescribeImages until every Images[].State is
#: available, failure on failed) with one acceptor more: InvalidAMIID.NotFound is retried, as its
#: ImageExists waiter does. An image CreateImage just made may not be visible yet to DescribeImages
#: (EC2's eventual consistency: https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html).
IMAGE_AVAILABLE = {"version": 2, "waiters": {"ImageAvailable": {
    "operation": "DescribeImages", "delay": 15, "maxAttempts": 40, "acceptors": [
        {"state": "success", "matcher": "pathAll", "argument": "Images[].State", "expected": "available"},
        {"state": "failure", "matcher": "pathAny", "argument": "Images[].State", "expected": "failed"},
        {"state": "retry", "matcher": "error", "expected": "InvalidAMIID.NotFound"}]}}}


def wait_available(ec2: Client, image_id: str, timeout_s: float = 1800, delay_s: float = 15) -> Item:
    """Wait (IMAGE_AVAILABLE: botocore's image_available waiter, not yet visible retried) until the
    image is available; its description.

    AWS takes minutes per image (the snapshot of the root volume); 30 min bounds it. Raises
    WaitTimeout past ``timeout_s``; AwsError when the image failed (with EC2's reason) or when
    DescribeImages answered an error other than not-yet-visible (with its code and message).
    """
    waiter = botocore.waiter.create_waiter_with_client("ImageAvailable", botocore.waiter.WaiterModel(IMAGE_AVAILABLE),
                                                       ec2)
    try:
        waiter.wait(ImageIds=[image_id], WaiterConfig={
            "Delay": delay_s, "MaxAttempts": max(1, int(timeout_s // max(delay_s, 0.001)))})
    except botocore.exceptions.WaiterError as exc:
        last = exc.last_response or {}
        error = last.get("Error") or {}
        if error and error.get("Code") != "InvalidAMIID.NotFound":
            raise AwsError(f"image {image_id} could not be read: {error.get('Code')}: {error.get('Message', '')}",
                           "bake again; the half-made image and its snapshots were removed")
        images = last.get("Images") or [{}]
        state = images[0].get("State") or ("not visible yet" if error else None)
        if state == "failed":
            reason = (images[0].get("StateReason") or {}).get("Message", "no reason given")
            raise AwsError(f"image {image_id} failed: {reason}", "bake again; nothing of it is kept")
        raise WaitTimeout(f"image {image_id} not available after {timeout_s:.0f} s (state {state})",
                          "bake again later; the half-made image and its snapshots were removed")
    image: Item = ec2.describe_images(ImageIds=[image_id])["Images"][0]
    return image


def snapshot_ids(image: Item) -> list[str]:
    """The EBS snapshots an image's block devices come from (pure)."""
    return [m["Ebs"]["SnapshotId"] for m in image.get("BlockDeviceMappings", []) if m.get("Ebs", {}).get("SnapshotId")]


def mark_complete(ec2: Client, image: Item) -> None:
    """Tag the image and its snapshots ec2gpu:bake=complete: from now on runs may use it."""
    ec2.create_tags(Resources=[image["ImageId"], *snapshot_ids(image)], Tags=[{"Key": BAKE, "Value": "complete"}])


def images(ec2: Client, run_id: str | None = None, complete: bool | None = True) -> list[Item]:
    """This account's images made by the tool in the client's region, newest first; one run's, and
    only complete (True), only incomplete (False) or all (None)."""
    filters = [{"Name": "tag-key", "Values": [IMAGE]}]
    if run_id:
        filters.append({"Name": f"tag:{tags.RUN}", "Values": [run_id]})
    found = described_images(ec2, Owners=["self"], Filters=filters)
    if complete is not None:
        found = [i for i in found if (tags.as_dict(i.get("Tags")).get(BAKE) == "complete") == complete]
    return sorted(found, key=lambda i: i.get("CreationDate", ""), reverse=True)


def newest_for(ec2: Client, setup_hash: str) -> Item | None:
    """The newest complete, available image baked for a setup with this hash, or None."""
    found = described_images(ec2, Owners=["self"], Filters=[
        {"Name": f"tag:{SETUP_HASH}", "Values": [setup_hash]}, {"Name": f"tag:{BAKE}", "Values": ["complete"]},
        {"Name": "state", "Values": ["available"]}])
    return max(found, key=lambda i: i.get("CreationDate", ""), default=None)


def snapshots(ec2: Client, run_id: str | None = None) -> list[Item]:
    """Snapshots tagged by an image bake (optionally one run's)."""
    filters = [{"Name": "tag-key", "Values": [IMAGE]}]
    if run_id:
        filters.append({"Name": f"tag:{tags.RUN}", "Values": [run_id]})
    pages = ec2.get_paginator("describe_snapshots").paginate(OwnerIds=["self"], Filters=filters)
    return [s for page in pages for s in page["Snapshots"]]


def find(ec2: Client, ref: str) -> Item | None:
    """A complete or incomplete image of the tool by AMI id or by name (the newest of that name)."""
    for image in images(ec2, complete=None):
        if ref in (image["ImageId"], tags.as_dict(image.get("Tags")).get(IMAGE)):
            return image
    return None


def delete(ec2: Client, image: Item, log: Log = lambda msg: None) -> list[str]:
    """Deregister ``image`` with its snapshots (DeleteAssociatedSnapshots), then delete any other
    snapshot tagged with its run; return the snapshot ids deleted. Raises AwsError for a snapshot
    still in use after the retries (delete_snapshots), ClientError for EC2's other refusals."""
    run_id = tags.as_dict(image.get("Tags")).get(tags.RUN)
    deleted = deregister(ec2, image["ImageId"], log)
    ids = set(snapshot_ids(image))
    if run_id:  # a bake run makes one image: every snapshot of the run is this image's
        ids |= {s["SnapshotId"] for s in snapshots(ec2, run_id)}
    return sorted(set(deleted) | set(delete_snapshots(ec2, sorted(ids - set(deleted)), log)))


#: InvalidSnapshot.InUse right after DeregisterImage: retried with exponential backoff (1, 2, 4, 8,
#: 16, 30, 30... s) for up to 5 minutes. The release of a deregistered image's snapshots is not
#: instantaneous (EC2's eventual consistency, see the module docstring); not measured on AWS here.
IN_USE_RETRY_S = 300.0
IN_USE_MAX_WAIT_S = 30.0


def delete_snapshots(ec2: Client, ids: list[str], log: Log = lambda msg: None, retry_s: float = IN_USE_RETRY_S,
                     max_wait_s: float = IN_USE_MAX_WAIT_S) -> list[str]:
    """Delete these snapshots (one already gone counts as deleted); the ids deleted.
    InvalidSnapshot.InUse is retried with bounded backoff (``retry_s`` in all, waits up to
    ``max_wait_s``) while no image of the tool lists the snapshot (the deregistration race); a
    snapshot an image of the tool still uses, or still in use after the retries, raises AwsError
    naming it. Raises ClientError for EC2's other refusals."""
    import tenacity

    def race(exc: BaseException) -> bool:
        return isinstance(exc, botocore.exceptions.ClientError) and \
            exc.response["Error"]["Code"] == "InvalidSnapshot.InUse" and not _used_by(ec2, sid)

    done = []
    for sid in ids:
        try:
            for attempt in tenacity.Retrying(retry=tenacity.retry_if_exception(race), reraise=True,
                                             wait=tenacity.wait_exponential(multiplier=1, max=max_wait_s),
                                             stop=tenacity.stop_after_delay(retry_s)):
                with attempt:
                    try:
                        ec2.delete_snapshot(SnapshotId=sid)
                    except botocore.exceptions.ClientError as exc:
                        if exc.response["Error"]["Code"] != "InvalidSnapshot.NotFound":
                            raise
        except botocore.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] != "InvalidSnapshot.InUse":
                raise
            users = _used_by(ec2, sid)
            if users:
                raise AwsError(f"snapshot {sid} is used by image {', '.join(users)}",
                               "`ec2gpu image rm` removes the image with its snapshots") from exc
            raise AwsError(f"snapshot {sid} is still in use after {retry_s:.0f} s: "
                           f"{exc.response['Error'].get('Message', '')}",
                           "`ec2gpu cleanup` deletes it later (its image is gone)") from exc
        log(f"deleted snapshot {sid}")
        done.append(sid)
    return done


def _used_by(ec2: Client, snapshot_id: str) -> list[str]:
    """The tool's images (any state, complete or not) whose block devices come from the snapshot."""
    return [i["ImageId"] for i in images(ec2, complete=None) if snapshot_id in snapshot_ids(i)]


def incomplete_snapshots(ec2: Client, run_id: str | None = None) -> list[Item]:
    """Snapshots of bakes (one run's, or all) whose image is gone, whatever their ec2gpu:bake tag
    says: no image of the tool lists them. A CreateImage whose answer never came leaves such, and so
    does an image deregistered without its snapshots (an `image rm` stopped between the two, or a
    snapshot still in use then). An incomplete image's own snapshots go with it (``deregister``)."""
    held = {sid for image in images(ec2, complete=None) for sid in snapshot_ids(image)}
    return [s for s in snapshots(ec2, run_id) if s["SnapshotId"] not in held]


def remove_incomplete(ec2: Client, run_id: str | None = None, log: Log = lambda msg: None) -> list[str]:
    """Deregister every incomplete image (one run's, or all) with its snapshots, then delete the
    bakes' snapshots whose image is gone. Returns the ids removed (images, then snapshots).
    Complete images are never touched."""
    gone, snaps = [], []
    for image in images(ec2, run_id, complete=False):
        snaps += deregister(ec2, image["ImageId"], log)
        gone.append(image["ImageId"])
    rest = [s["SnapshotId"] for s in incomplete_snapshots(ec2, run_id) if s["SnapshotId"] not in snaps]
    return gone + snaps + delete_snapshots(ec2, rest, log)


def deregister(ec2: Client, image_id: str, log: Log = lambda msg: None) -> list[str]:
    """DeregisterImage with DeleteAssociatedSnapshots=True; the ids of the snapshots EC2 deleted with
    it (ReturnCode success; one it skipped, e.g. shared with another image, is left to
    delete_snapshots). An image already gone counts as done (no snapshot deleted)."""
    try:
        answer = ec2.deregister_image(ImageId=image_id, DeleteAssociatedSnapshots=True)
    except botocore.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] not in ("InvalidAMIID.NotFound", "InvalidAMIID.Unavailable"):
            raise
        return []
    log(f"deregistered {image_id}")
    deleted = [r["SnapshotId"] for r in answer.get("DeleteSnapshotResults", [])
               if r.get("ReturnCode") == "success" and r.get("SnapshotId")]
    for sid in deleted:
        log(f"deleted snapshot {sid} with {image_id}")
    return deleted


def stored_gib(snapshot: Item) -> tuple[float, str]:
    """A snapshot's stored size in GiB and its basis (pure): FullSnapshotSizeInBytes where EC2
    reports it, else the source volume's size (an upper bound: a snapshot stores used blocks)."""
    full = snapshot.get("FullSnapshotSizeInBytes")
    if full:
        return full / 2**30, "stored bytes"
    return float(snapshot.get("VolumeSize") or 0), "volume size (upper bound)"


def listing(ec2: Client, usd_per_gb_month: float | None) -> list[dict[str, Any]]:
    """Every complete baked image with what is inside, its snapshots' stored GiB (``stored_gib``)
    and what they cost per month: "usd_per_month", USD at ``usd_per_gb_month`` (the region's EBS
    snapshot price, USD per GB-month: catalog.ebs_price), None when that price is not known."""
    snaps = {s["SnapshotId"]: s for s in snapshots(ec2)}
    rows = []
    for image in images(ec2):
        tg = tags.as_dict(image.get("Tags"))
        sizes = [stored_gib(snaps[s]) for s in snapshot_ids(image) if s in snaps]
        gib = sum(g for g, _ in sizes)
        rows.append({
            "name": tg.get(IMAGE), "image_id": image["ImageId"], "state": image.get("State"),
            "created": image.get("CreationDate"), "task": tg.get(TASK), "setup_hash": tg.get(SETUP_HASH),
            "base": tg.get(BASE), "base_image": tg.get(BASE_IMAGE), "run_id": tg.get(tags.RUN),
            **{key.removesuffix("_version"): tg.get(tag) for key, tag in VERSIONS.items()},
            "snapshots": snapshot_ids(image), "snapshot_gib": round(gib, 2),
            "size_basis": sizes[0][1] if sizes else "no snapshot found",
            "usd_per_month": None if usd_per_gb_month is None else round(gib * usd_per_gb_month, 4)})
    return rows
