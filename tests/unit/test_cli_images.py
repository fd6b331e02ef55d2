"""`ec2gpu image` (cli/images.py) without a sandbox: `image bake --max-runtime` reaches the bake, and
`image ls` prices snapshots at the region's EBS snapshot price, or says it does not know it."""
import json
from types import SimpleNamespace

import pytest

from ec2gpu import api, cli
from ec2gpu.aws import baked, catalog
from ec2gpu.cli import images as image_cli
from ec2gpu.errors import UsageError
from ec2gpu.runs.provision import bake


@pytest.fixture
def bake_calls(monkeypatch, tmp_path):
    """The keyword arguments of each api.bake call the CLI makes (the fake stops there, exit 2)."""
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    calls = []

    def fake(task, **kwargs):
        calls.append(kwargs)
        raise UsageError("stopped by the test", "-")
    monkeypatch.setattr(api, "bake", fake)
    return calls


def test_image_bake_passes_max_runtime_to_the_bake_and_refuses_one_below_ten_minutes(bake_calls, capsys):
    assert cli.main(["image", "bake", "mnist", "--max-runtime", "45"]) == 2
    assert bake_calls[-1]["max_runtime"] == 45
    assert cli.main(["image", "bake", "mnist"]) == 2
    assert bake_calls[-1].get("max_runtime") is None  # the bake's default: runs/provision/bake.builder_max_runtime
    assert cli.main(["image", "bake", "mnist", "--max-runtime", "9"]) == 2  # typer's range: nothing called
    assert len(bake_calls) == 2 and "--max-runtime" in capsys.readouterr().err
    assert cli.main(["image", "bake", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "--max-runtime" in shown and f"at least {bake.MIN_MAX_RUNTIME_MINUTES}, default " \
        f"{bake.MAX_RUNTIME_MINUTES}" in shown.replace("│ ", "")


def _one_image(monkeypatch, gib: float) -> None:
    """aws/baked's listing sees one complete image whose snapshot stores ``gib`` GiB."""
    image = {"ImageId": "ami-1", "State": "available", "CreationDate": "2026-11-20T10:00:00.000Z",
             "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": "snap-1"}}],
             "Tags": [{"Key": baked.IMAGE, "Value": "proj-1"}, {"Key": baked.BAKE, "Value": "complete"}]}
    monkeypatch.setattr(baked, "images", lambda ec2, *a, **k: [image])
    monkeypatch.setattr(baked, "snapshots", lambda ec2, *a, **k: [
        {"SnapshotId": "snap-1", "FullSnapshotSizeInBytes": int(gib * 2**30), "VolumeSize": 100}])


def test_image_ls_prices_snapshots_at_the_regions_price_and_says_when_it_is_unknown(monkeypatch, tmp_path):
    _one_image(monkeypatch, 40.0)
    # a refreshed cache (`ec2gpu prices --refresh --region eu-central-1`) holds that region's price
    cache = catalog.price_cache_path(tmp_path, "eu-central-1")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"region": "eu-central-1", "prices": {}, "fetched_at": "2026-11-21T00:00:00+00:00",
                                 "storage": {"snapshot": 0.054}}))
    [row] = bake.listing(SimpleNamespace(region="eu-central-1", ec2=None), tmp_path)
    assert row["usd_per_month"] == pytest.approx(40 * 0.054) and row["usd_per_gb_month"] == 0.054  # not 0.05
    assert "Price List API, fetched 2026-11-21" in row["price_source"]
    assert "0.054 USD per GB-month (EBS standard tier, eu-central-1; AWS Price List API" in \
        image_cli.snapshot_price_words("eu-central-1", row["usd_per_gb_month"], row["price_source"])
    # the shipped table's region: its own row of the table, with the table's source
    [row] = bake.listing(SimpleNamespace(region="us-west-2", ec2=None), tmp_path)
    assert row["usd_per_month"] == pytest.approx(40 * catalog.EBS_USD_PER_GB_MONTH["us-west-2"]["snapshot"])
    assert "shipped table (us-west-2, https://aws.amazon.com/ebs/pricing/" in row["price_source"]
    # a region neither knows: unknown, never us-east-1's price, and how to get it
    [row] = bake.listing(SimpleNamespace(region="ap-south-1", ec2=None), tmp_path)
    assert row["usd_per_month"] is None and row["usd_per_gb_month"] is None
    words = image_cli.snapshot_price_words("ap-south-1", None, row["price_source"])
    assert words.startswith("$/month: unknown in ap-south-1") and "ec2gpu prices --refresh --region ap-south-1" in words


def test_image_ls_shows_unknown_in_the_table_for_a_region_without_a_price(monkeypatch, tmp_path, capsys):
    _one_image(monkeypatch, 40.0)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from ec2gpu.aws import session
    monkeypatch.setattr(session.Aws, "check_credentials", lambda self: None)
    assert cli.main(["image", "ls", "--region", "ap-south-1"]) == 0
    shown = capsys.readouterr().out
    assert "unknown" in shown.split("proj-1")[1].splitlines()[0]  # the image's $/month cell
    assert "$/month: unknown in ap-south-1" in " ".join(shown.split())
