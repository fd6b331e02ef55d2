"""docs/iam-policy.json, read by an independent IAM linter (parliament) and by hand."""
import json
from pathlib import Path

POLICY = Path(__file__).resolve().parents[2] / "docs" / "iam-policy.json"

#: findings above LOW that are known to be false positives, with why. CreateImage is authorised per
#: resource (the instance, the new image, the new snapshots: each must be allowed by some statement,
#: https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html), and the
#: policy allows them in two statements with different conditions (the instance must carry the
#: tool's tag, the new image and snapshots must be created with it); parliament expects every
#: resource type of an action in each statement.
DOCUMENTED_FALSE_POSITIVES: dict[tuple[str, str], str] = {
    ("RESOURCE_MISMATCH", json.dumps([{"action": "ec2:CreateImage", "required_format": "arn:*:ec2:*::image/*"},
                                      {"action": "ec2:CreateImage", "required_format": "arn:*:ec2:*::snapshot/*"}])):
        "the new image and snapshots are allowed by BakedImagesAndSnapshotsAreTaggedAtCreation",
    ("RESOURCE_MISMATCH", json.dumps([{"action": "ec2:CreateImage", "required_format": "arn:*:ec2:*:*:instance/*"}])):
        "the builder instance is allowed by BakeImagesOnlyOfEc2gpuInstances",
}


def test_parliament_finds_nothing_above_low():
    from parliament import analyze_policy_string, enhance_finding

    findings = [enhance_finding(f) for f in analyze_policy_string(POLICY.read_text()).findings]
    above_low = [(f.issue, json.dumps(f.detail, default=str)) for f in findings
                 if f.severity not in ("LOW", "INFO", "MUTE")
                 and (f.issue, json.dumps(f.detail, default=str)) not in DOCUMENTED_FALSE_POSITIVES]
    assert above_low == []
    assert findings, "parliament saw the policy"  # RESOURCE_STAR (LOW) for the Describe* calls at least


def test_ports_can_be_opened_only_on_groups_the_tool_tagged():
    statements = json.loads(POLICY.read_text())["Statement"]
    opening = [s for s in statements if "ec2:AuthorizeSecurityGroupIngress" in s["Action"]]
    assert opening and all(s["Resource"] == "arn:aws:ec2:*:*:security-group/*"
                           and s["Condition"] == {"Null": {"aws:ResourceTag/ec2gpu:run": "false"}} for s in opening)


def test_the_service_linked_roles_may_be_created_for_spot_and_auto_scaling_only():
    statements = json.loads(POLICY.read_text())["Statement"]
    slrs = {s["Condition"]["StringEquals"]["iam:AWSServiceName"]: s["Resource"] for s in statements
            if "iam:CreateServiceLinkedRole" in s["Action"]}
    assert slrs == {"spot.amazonaws.com": "arn:aws:iam::*:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot",
                    "autoscaling.amazonaws.com": "arn:aws:iam::*:role/aws-service-role/autoscaling.amazonaws.com/"
                                                 "AWSServiceRoleForAutoScaling"}
    assert all(list(s["Condition"]) == ["StringEquals"] for s in statements if "iam:CreateServiceLinkedRole" in s["Action"])
