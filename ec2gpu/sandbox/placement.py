"""Placement groups in the sandbox, as EC2 keeps them (moto does not implement them).

EC2's CreatePlacementGroup, DescribePlacementGroups and DeletePlacementGroup
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html,
API_DescribePlacementGroups.html, API_DeletePlacementGroup.html) and their error codes
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html):

- a group is created ``available``, with its tags, a ``pg-`` id and an ARN; a second one of the same
  name answers ``InvalidPlacementGroup.Duplicate``;
- DescribePlacementGroups filters by ``group-name``, ``strategy``, ``state``, ``tag-key`` and
  ``tag:KEY``, and answers ``InvalidPlacementGroup.Unknown`` for a GroupNames entry it does not have;
- DeletePlacementGroup of a group that does not exist answers ``InvalidPlacementGroup.Unknown``.

Without these a multi-node run launched without its group and every `down` and `cancel` said that
placement groups could not be listed (aws/placement.py), which EC2 never says.
"""
from __future__ import annotations

import secrets
import threading
from typing import Any

_GROUPS: dict[tuple[str, str, str], dict[str, Any]] = {}  # (account, region, name) -> EC2's PlacementGroup
_LOCK = threading.Lock()
STRATEGIES = ("cluster", "spread", "partition")  # EC2's PlacementStrategy values (botocore's model)


def matches(group: dict[str, Any], filters: dict[str, list[str]]) -> bool:
    """Whether ``group`` (EC2's PlacementGroup) passes every one of ``filters`` ({name: values}) (pure)."""
    tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
    for name, values in filters.items():
        if name.startswith("tag:"):
            ok = tags.get(name[4:]) in values
        elif name == "tag-key":
            ok = any(v in tags for v in values)
        elif name in ("group-name", "strategy", "state"):
            ok = group[{"group-name": "GroupName", "strategy": "Strategy", "state": "State"}[name]] in values
        else:
            ok = True  # a filter the sandbox does not know narrows nothing
        if not ok:
            return False
    return True


def strategy(account: str, region: str, name: str) -> str | None:
    """The strategy of the placement group ``name`` of that account and region, or None without one."""
    with _LOCK:
        group = _GROUPS.get((account, region, name))
    return None if group is None else str(group["Strategy"])


def install() -> None:
    """Give moto's EC2 the three actions (call in the daemon after importing moto)."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses import EC2Response
    from moto.core.responses import ActionResult

    def unknown(name: str) -> EC2ClientError:
        return EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")

    def create_placement_group(self):
        name, strategy = self._get_param("GroupName"), self._get_param("Strategy")
        if not name or strategy not in STRATEGIES:
            raise EC2ClientError("InvalidParameterValue",
                                 f"Value ({strategy}) for parameter strategy is invalid." if name
                                 else "The request must contain the parameter groupName")
        tags = self._parse_tag_specification("placement-group").get("placement-group", {})
        key = (self.current_account, self.region, name)
        group_id = "pg-" + secrets.token_hex(9)[:17]
        group = {"GroupName": name, "State": "available", "Strategy": strategy, "GroupId": group_id,
                 "GroupArn": f"arn:aws:ec2:{self.region}:{self.current_account}:placement-group/{name}",
                 "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        with _LOCK:
            if key in _GROUPS:
                raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
            _GROUPS[key] = group
        return ActionResult({"PlacementGroup": group})

    def describe_placement_groups(self):
        names = self._get_param("GroupNames", []) or []
        filters = self._filters_from_querystring()
        with _LOCK:
            mine = {n: g for (acct, region, n), g in _GROUPS.items()
                    if acct == self.current_account and region == self.region}
        for name in names:
            if name not in mine:
                raise unknown(name)
        return ActionResult({"PlacementGroups": [g for n, g in mine.items()
                                                 if (not names or n in names) and matches(g, filters)]})

    def delete_placement_group(self):
        name = self._get_param("GroupName")
        with _LOCK:
            if _GROUPS.pop((self.current_account, self.region, name), None) is None:
                raise unknown(name)
        return ActionResult({})

    for fn in (create_placement_group, describe_placement_groups, delete_placement_group):
        setattr(EC2Response, fn.__name__, fn)
