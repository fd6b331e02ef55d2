"""Where a SkyPilot task runs: its ``infra`` (or ``cloud``/``region``/``zone``) and the --infra flag,
read as AWS and one of its regions.

SkyPilot's ``infra`` is 'CLOUD[/REGION[/ZONE]]'
(https://docs.skypilot.co/en/latest/reference/yaml-spec.html, resources.infra). ec2gpu runs on AWS
alone: another cloud is refused unless --infra aws (SkyPilot's own override flag) says to run it on
AWS, with a warning; a zone is warned about, as ec2gpu chooses the zone at launch (aws/capacity.py).
Pure.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError
from .lines import Lines, refuse
from .spec import REGION_RE

#: --infra: SkyPilot's flag that overrides the task's infra (``sky launch --infra aws``)
INFRA_FLAG = "--infra"
OTHER_CLOUD_HINT = (f"ec2gpu runs on AWS: pass {INFRA_FLAG} aws (SkyPilot's own override flag) to run it there, "
                    f"or {INFRA_FLAG} aws/REGION")


def other_cloud(entry: dict[str, Any]) -> str | None:
    """"infra: gcp/us-central1" when the candidate ``entry`` names a cloud other than AWS, else None."""
    for k in ("infra", "cloud"):
        v = entry.get(k)
        if isinstance(v, str) and v.strip() and v.strip().split("/")[0].lower() not in ("aws", "*"):
            return f"{k}: {v}"
    return None


def parse_infra(text: str) -> tuple[str, str | None, str | None]:
    """SkyPilot's ``infra`` 'CLOUD[/REGION[/ZONE]]' -> (cloud, region, zone) (pure): the cloud
    lower-cased ('k8s' is 'kubernetes'; '*' any), a '*' or missing part None
    (https://docs.skypilot.co/en/latest/reference/yaml-spec.html, resources.infra;
    sky/utils/infra_utils.py). 'aws/us-west-2/us-west-2a' -> ('aws', 'us-west-2', 'us-west-2a');
    'k8s/my-context' -> ('kubernetes', 'my-context', None)."""
    parts = [p.strip() for p in str(text).strip().split("/")]
    cloud = {"k8s": "kubernetes"}.get(parts[0].lower(), parts[0].lower())
    region = parts[1] if len(parts) > 1 and parts[1] not in ("", "*") else None
    zone = "/".join(parts[2:]) if len(parts) > 2 and parts[2] not in ("", "*") else None
    return cloud, region, zone


def _region_of_zone(zone: str) -> str | None:
    """'us-west-2a' -> 'us-west-2'; a Local Zone 'us-east-1-bos-1a' -> 'us-east-1' (pure); None when
    ``zone`` does not start with a region."""
    m = re.match(r"([a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-[0-9]+)(?=[a-z]|-)", zone)
    return m.group(1) if m else None


def zone_note(zone: str, region: str | None) -> str:
    """The warning for a zone asked (pure): ec2gpu chooses it at launch."""
    return (f"zone {zone}: ec2gpu chooses the availability zone at launch (any zone of {region or 'the region'} "
            "with capacity, the next one on InsufficientInstanceCapacity), so the run may start in another zone")


def aws_infra(value: str, what: str = INFRA_FLAG) -> tuple[str | None, str | None]:
    """The --infra flag's 'aws', 'aws/REGION' or 'aws/REGION/ZONE' -> (region, zone), each None
    where not given (pure). Raises UsageError for another cloud, a region that is not an AWS one,
    or a zone outside the region."""
    cloud, region, zone = parse_infra(value)
    if cloud != "aws":
        raise UsageError(f"{what} {value}: ec2gpu runs on AWS only", "give aws, aws/REGION or aws/REGION/ZONE, "
                         "e.g. --infra aws/us-west-2")
    if region is not None and not REGION_RE.fullmatch(region):
        raise UsageError(f"{what} {value}: {region!r} is not an AWS region", "e.g. aws/us-east-1, aws/us-west-2")
    if zone is not None and _region_of_zone(zone) != region:
        raise UsageError(f"{what} {value}: {zone!r} is not a zone of {region}", f"e.g. aws/{region}/{region}a")
    return region, zone


def location(res: dict[str, Any], source: str, lines: Lines, warnings: list[str], infra: str | None) -> str | None:
    """SkyPilot's ``infra`` or ``cloud``/``region``/``zone`` of ``res`` (taken out of it) -> the AWS
    region to run in (None: the configured one). The zone is warned about: ec2gpu chooses it at
    launch. ``infra``: the --infra flag: the file's cloud, if another, is replaced by AWS and its
    region and zone dropped, each with a warning; an AWS region in the file is kept unless the flag
    names one (api.run: the flag's wins).

    Raises UsageError at the field's line for another cloud without the flag, ``infra`` given with
    ``cloud``/``region``/``zone`` (SkyPilot refuses that too: sky/resources.py), a zone outside the region."""
    loc = ("resources",)
    given = {k: res.pop(k) for k in ("infra", "cloud", "region", "zone") if res.get(k) is not None}
    for unasked in [k for k in ("infra", "cloud", "region", "zone") if k in res]:
        res.pop(unasked)  # null: not asked
    if not given:
        return None
    for k, v in given.items():
        if not isinstance(v, str) or not v.strip():
            raise refuse(source, lines, loc + (k,), f"{v!r} is not a {k}", "e.g. infra: aws/us-east-1")
    if "infra" in given and len(given) > 1:
        other = next(k for k in given if k != "infra")
        raise refuse(source, lines, loc + (other,), f"infra and {other} together: SkyPilot refuses both too",
                     "write infra: aws/REGION/ZONE alone")
    if "infra" in given:
        field_, (cloud, region, zone) = "infra", parse_infra(given["infra"])
    else:
        field_ = "cloud" if "cloud" in given else "region" if "region" in given else "zone"
        cloud, region, zone = (given.get("cloud") or "*").strip().lower(), given.get("region"), given.get("zone")
        cloud = {"k8s": "kubernetes"}.get(cloud, cloud)
    written = given[field_]
    if cloud not in ("aws", "*"):
        if infra is None:
            raise refuse(source, lines, loc + (field_,), f"{written}: another cloud than AWS", OTHER_CLOUD_HINT)
        warnings.append(f"resources.{field_}: {written} replaced by {INFRA_FLAG} {infra}: the task runs on AWS"
                        + (f" (the other cloud's {'region ' + region if region else ''}"
                           f"{' and ' if region and zone else ''}{'zone ' + zone if zone else ''} dropped)"
                           if region or zone else ""))
        return None
    if region is not None and not REGION_RE.fullmatch(region.strip()):
        if infra is not None:
            warnings.append(f"resources.{field_}: {written}: {region!r} is not an AWS region: dropped for "
                            f"{INFRA_FLAG} {infra}")
            return None
        raise refuse(source, lines, loc + (field_,), f"{written}: {region!r} is not an AWS region (another cloud's?)",
                     OTHER_CLOUD_HINT)
    if zone is not None:
        region = region or _region_of_zone(zone.strip())
        if region is None or _region_of_zone(zone.strip()) != region:
            raise refuse(source, lines, loc + (("zone" if "zone" in given else field_),),
                         f"{zone!r} is not an availability zone of {region or 'an AWS region'}",
                         "e.g. infra: aws/us-west-2/us-west-2a")
        warnings.append(f"resources.{'zone' if 'zone' in given else field_}: {zone_note(zone.strip(), region)}")
    return region.strip() if region else None
