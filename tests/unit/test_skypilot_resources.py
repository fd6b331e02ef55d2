"""SkyPilot's `resources` fields beyond the GPU (issue 28, item 6): cpus and memory choose the type
with the GPU; infra/cloud/region/zone, image_id, ports, autostop and job_recovery become the run's
region, AMI, forwarded ports and idle rule, or are refused or warned about in one line; `--infra aws`
runs a file written for another cloud on AWS. Pure: load.parse, and api.run(..., dry_run=True) (its RunPlan
as runs/plan/dryrun.plan shows it), which calls no AWS API."""
import json

import pytest

from ec2gpu import api, cli
from ec2gpu.errors import UsageError
from ec2gpu.runs.plan import dryrun
from ec2gpu.tasks import load, resolve

GPU = "run: x\nresources:\n  accelerators: {gpu}\n"


def parse(resources: str, **kw):
    """load.parse of a SkyPilot task whose resources are the YAML lines ``resources``."""
    return load.parse("run: x\nresources:\n" + "".join(f"  {line}\n" for line in resources.splitlines()), "t.yaml",
                      **kw)


def types(loaded) -> list[str]:
    return [c.instance_type for c in resolve.plan(loaded.task.resources).choices]


def write(directory, text: str, name: str = "t.yaml") -> str:
    (directory / name).write_text(text)
    return name


# -- cpus and memory ------------------------------------------------------------------------------

@pytest.mark.parametrize("resources, chosen", [
    ("accelerators: T4:1\ncpus: 8+", "g4dn.2xlarge"),  # at least 8 vCPUs: the cheapest 1 x T4 with 8 or more
    ("accelerators: T4:1\ncpus: 16", "g4dn.4xlarge"),  # exactly 16 (sky/catalog/common.py, _filter_with_cpus)
    ("accelerators: T4:1\nmemory: 64+", "g4dn.4xlarge"),
    ("accelerators: L4:1\nmemory: 32GB", "g6.2xlarge"),  # a unit: GB is GiB, as SkyPilot reads it
    ("accelerators: A10G:1\ncpus: 8+\nmemory: 64+", "g5.4xlarge"),
    ("accelerators: H100:1\nmemory: 16x", "p5.4xlarge"),  # at least 16 GiB per vCPU: 256 GiB for 16 vCPUs
    ("accelerators: {H100:8, H200:8}\ncpus: 192+", "p5.48xlarge"),
])
def test_cpus_and_memory_choose_the_cheapest_type_with_the_gpu_that_meets_them(resources, chosen):
    got = parse(resources)
    assert types(got)[0] == chosen and not got.warnings


def test_without_cpus_or_memory_the_gpu_alone_chooses_as_before():
    assert types(parse("accelerators: T4:1")) == ["g4dn.xlarge"]


def test_cpus_no_type_of_the_gpu_meets_are_refused_in_one_line_naming_what_they_offer():
    with pytest.raises(UsageError) as exc:
        parse("accelerators: T4:1\ncpus: 128")
    msg = exc.value.message
    assert msg.startswith("t.yaml:3: resources.accelerators: no EC2 instance type with 1 x T4 has cpus: 128 "
                          "(exactly 128 vCPUs)")
    assert "4-64 vCPUs" in msg and "g4dn.16xlarge 64 vCPUs 256 GiB" in msg and "\n" not in msg
    assert "cpus: N+" in exc.value.hint


def test_cpus_alone_choose_among_the_catalogs_gpu_types_and_the_warning_says_so():
    got = parse("cpus: 8+\nmemory: 32+")
    assert types(got) == ["g4dn.2xlarge"]
    [warning] = got.warnings
    assert "a GPU tool" in warning and "g4dn.2xlarge (1 x T4, 8 vCPUs, 32 GiB" in warning
    assert "SkyPilot would choose a CPU instance" in warning


def test_exactly_n_vcpus_no_gpu_type_has_is_refused_at_the_cpus_line():
    with pytest.raises(UsageError, match=r"t\.yaml:4: resources\.cpus: no EC2 instance type with a GPU in ec2gpu's "
                                         r"catalog has cpus: 2 \(exactly 2 vCPUs\): they offer 4-192 vCPUs"):
        parse("disk_size: 100\ncpus: 2")


def test_cpus_and_memory_are_ec2gpus_own_fields_too():
    got = load.parse("workdir: null\nresources:\n  gpu: A10G:1\n  cpus: 16\n  memory: 64+\nrun: x\n", "t.yaml")
    assert not got.skypilot and types(got) == ["g5.4xlarge"] and not got.warnings


def test_an_instance_type_that_does_not_meet_cpus_is_refused_as_skypilot_refuses_it():
    with pytest.raises(UsageError, match=r"resources\.instance_type: g5\.xlarge has 4 vCPUs and 16 GiB, not cpus: 8\+"):
        parse("instance_type: g5.xlarge\ncpus: 8+")


@pytest.mark.parametrize("value", ["lots", "8++", "-4", "0"])
def test_a_cpus_value_that_is_not_a_count_is_refused_at_its_line(value):
    with pytest.raises(UsageError, match=r"t\.yaml:4: resources\.cpus: .*not a vCPU count"):
        parse(f"accelerators: T4:1\ncpus: {value}")


@pytest.mark.parametrize("text, gib, kind", [("32", 32, "exact"), ("64+", 64, "plus"), ("1TB+", 1024, "plus"),
                                             ("512MB", 0.5, "exact"), ("4x", 4, "x"), (16, 16, "exact")])
def test_memory_is_read_in_gib_with_skypilots_units(text, gib, kind):
    assert resolve.parse_memory(text) == (gib, kind)


# -- infra, cloud, region, zone --------------------------------------------------------------------

@pytest.mark.parametrize("location", ["cloud: gcp", "infra: gcp", "infra: k8s", "infra: kubernetes",
                                      "infra: runpod/US", "infra: gcp/us-central1/us-central1-a", "cloud: nebius"])
def test_a_file_naming_another_cloud_is_refused_with_the_infra_aws_hint(location):
    with pytest.raises(UsageError) as exc:
        parse(f"accelerators: L4:1\n{location}")
    assert exc.value.message.startswith("t.yaml:4: resources.") and "another cloud than AWS" in exc.value.message
    assert "--infra aws" in exc.value.hint


def test_infra_aws_runs_another_clouds_file_on_aws_dropping_its_region_with_a_warning():
    got = parse("accelerators: L4:1\ninfra: gcp/us-central1", infra="aws")
    assert got.task.resources.region is None and types(got) == ["g6.xlarge"]
    [warning] = got.warnings
    assert "replaced by --infra aws" in warning and "us-central1 dropped" in warning


@pytest.mark.parametrize("location, region, zone_warned", [
    ("infra: aws", None, False),
    ("infra: aws/us-west-2", "us-west-2", False),
    ("infra: aws/us-west-2/us-west-2a", "us-west-2", True),
    ("cloud: aws\nregion: us-east-2", "us-east-2", False),
    ("region: eu-central-1\nzone: eu-central-1b", "eu-central-1", True),
    ("zone: us-west-2c", "us-west-2", True),
])
def test_an_aws_location_becomes_the_runs_region_and_a_zone_is_said_to_be_chosen_at_launch(location, region,
                                                                                          zone_warned):
    got = parse(f"accelerators: L4:1\n{location}")
    assert got.task.resources.region == region
    assert [("chooses the availability zone at launch" in w) for w in got.warnings] == ([True] if zone_warned else [])


@pytest.mark.parametrize("location, what", [
    ("infra: aws/us-west-2\nregion: us-west-2", "infra and region together"),
    ("infra: aws/us-west-2/us-east-1a", "'us-east-1a' is not an availability zone of us-west-2"),
    ("region: us-central1", "'us-central1' is not an AWS region"),
])
def test_a_location_that_cannot_be_run_is_refused_in_one_line(location, what):
    with pytest.raises(UsageError, match=what):
        parse(f"accelerators: L4:1\n{location}")


def test_the_infra_flag_sets_the_runs_region_and_a_file_on_another_cloud_runs_on_aws(no_aws):
    name = write(no_aws, "workdir: null\nresources:\n  infra: gcp\n  accelerators: L4:1\nrun: x\n")
    with pytest.raises(UsageError, match="another cloud than AWS"):
        api.run(name, dry_run=True)
    warned = []
    plan = dryrun.plan(api.run(name, dry_run=True, infra="aws/us-west-2/us-west-2b", on_warning=warned.append))
    assert plan["region"] == "us-west-2" and plan["region_source"] == "--infra"
    assert any("replaced by --infra" in w for w in warned) and any("us-west-2b" in w for w in warned)
    with pytest.raises(UsageError, match="ec2gpu runs on AWS only"):
        api.run(name, dry_run=True, infra="gcp")
    with pytest.raises(UsageError, match="name different regions"):
        api.run(name, dry_run=True, infra="aws/us-west-2", region="us-east-1")


def test_the_files_aws_region_is_the_runs_unless_a_flag_names_one(no_aws):
    name = write(no_aws, "workdir: null\nresources:\n  infra: aws/us-east-2\n  accelerators: L4:1\nrun: x\n")
    assert dryrun.plan(api.run(name, dry_run=True))["region"] == "us-east-2"
    assert dryrun.plan(api.run(name, dry_run=True, region="us-west-2"))["region"] == "us-west-2"


# -- image_id -------------------------------------------------------------------------------------

def test_image_id_an_ami_or_one_per_region_is_the_runs_ami_for_its_region(no_aws):
    one = write(no_aws, "workdir: null\nresources:\n  image_id: ami-0123456789abcdef0\n  accelerators: L4:1\n"
                        "run: x\n", "one.yaml")
    plan = dryrun.plan(api.run(one, dry_run=True))
    assert plan["ami"] == "ami-0123456789abcdef0" and plan["image"] == "ami-0123456789abcdef0"
    per_region = write(no_aws, "workdir: null\nresources:\n  image_id:\n    us-east-1: ami-0729d913a335efca7\n"
                               "    us-west-2: ami-050814f384259894c\n  accelerators: L4:1\nrun: x\n", "map.yaml")
    assert dryrun.plan(api.run(per_region, dry_run=True, region="us-west-2"))["ami"] == "ami-050814f384259894c"
    assert dryrun.plan(api.run(per_region, dry_run=True, region="us-west-2",
                               ami="ami-0aaaaaaaaaaaaaaaa"))["ami"] == "ami-0aaaaaaaaaaaaaaaa"  # --ami wins
    with pytest.raises(UsageError, match="has no AMI for eu-west-1: it names us-east-1, us-west-2"):
        api.run(per_region, dry_run=True, region="eu-west-1")


def test_a_docker_image_is_refused_in_one_line_not_ignored():
    with pytest.raises(UsageError) as exc:
        parse("accelerators: L4:1\nimage_id: docker:nvcr.io/nvidia/pytorch:24.07-py3")
    assert exc.value.message.startswith("t.yaml:4: resources.image_id: docker:nvcr.io/nvidia/pytorch:24.07-py3: "
                                        "running the job in a container is not supported yet")
    assert "docker run" in exc.value.hint


def test_skypilots_own_image_tag_runs_the_default_image_with_a_warning_and_another_image_is_refused():
    got = parse("accelerators: L4:1\nimage_id: skypilot:gpu-ubuntu-2004")
    assert got.task.resources.ami is None and "SkyPilot's own image tag" in got.warnings[0]
    with pytest.raises(UsageError, match="not an AMI id"):
        parse("accelerators: L4:1\nimage_id: projects/deeplearning-platform-release/global/images/x")


# -- ports, autostop, job_recovery ----------------------------------------------------------------

def test_ports_are_forwarded_over_ssh_not_opened_and_the_warning_says_so(no_aws):
    got = parse("accelerators: L4:1\nports: [8000, 10022-10024]")
    assert got.task.ports == [8000, 10022, 10023, 10024]
    [warning] = got.warnings
    assert "forwarded from node 0 to 127.0.0.1" in warning and "not opened to the internet" in warning
    name = write(no_aws, "workdir: null\nresources:\n  ports: 8265\n  accelerators: L4:1\nrun: x\n")
    [port] = dryrun.plan(api.run(name, dry_run=True))["ports"]
    # a task file's port goes to a free port here, never its own number (issue 44.7: a task must not take
    # a local port a client here trusts); --port names one that keeps it
    assert port["port"] == 8265 and port["local"] == "127.0.0.1:(a free port, said when the job starts)"
    assert "not opened" in port["how"]
    [port] = dryrun.plan(api.run(name, dry_run=True, ports=[8265]))["ports"]
    assert port["local"] == "127.0.0.1:8265"


@pytest.mark.parametrize("autostop, minutes", [
    ("{idle_minutes: 30, down: true}", 30), ("45", 45), ("2h", 120), ("true", 10), ("2", 10)])
def test_autostop_becomes_the_idle_rule_of_at_least_ten_minutes(autostop, minutes):
    got = parse(f"accelerators: L4:1\nautostop: {autostop}")
    assert got.task.idle_timeout == minutes
    assert any("autostop" in w and f"for {minutes} min terminates itself" in w for w in got.warnings)


def test_autostop_is_the_idle_rule_the_run_launches_with(no_aws):
    name = write(no_aws, "workdir: null\nresources:\n  autostop: {idle_minutes: 30, down: false}\n"
                         "  accelerators: L4:1\nrun: x\n")
    plan = dryrun.plan(api.run(name, dry_run=True))
    assert plan["idle_rule"]["minutes"] == plan["idle_rule_minutes"] == 30
    assert plan["idle_rule"]["action"] == "terminate" and "autostop" in plan["idle_rule"]["source"]
    assert any("terminated, not stopped" in c for c in plan["changes"])
    assert dryrun.plan(api.run(write(no_aws, GPU.format(gpu="L4:1"), "plain.yaml"), dry_run=True))["idle_rule"] is None


def test_autostop_false_leaves_no_idle_rule_and_says_the_run_still_ends_its_instances():
    got = parse("accelerators: L4:1\nautostop: false")
    assert got.task.idle_timeout is None and "still terminates its instances" in got.warnings[0]


@pytest.mark.parametrize("recovery, said", [
    ("job_recovery: {strategy: EAGER_NEXT_REGION, max_restarts_on_errors: 3}",
     ["does not move to another region", "restarted up to 3 times in a detached run (--detach) only"]),
    ("spot_recovery: FAILOVER", ["ec2gpu's own spot recovery"]),
])
def test_job_recovery_maps_to_ec2gpus_spot_recovery_and_names_each_difference(recovery, said):
    got = parse(f"accelerators: L4:1\nuse_spot: true\n{recovery}")
    assert got.task.resources.spot
    [warning] = got.warnings
    assert all(s in warning for s in said) and "replaced in the same region" in warning
    assert got.task.resources.max_restarts_on_errors == (3 if "max_restarts_on_errors" in recovery else 0)


@pytest.mark.parametrize("bad", ["-1", "101", "'3'", "true"])
def test_a_restart_count_that_is_not_one_is_refused_at_its_line(bad):
    with pytest.raises(UsageError, match="max_restarts_on_errors"):
        parse(f"accelerators: L4:1\njob_recovery: {{max_restarts_on_errors: {bad}}}")


def test_the_json_plan_shows_region_ami_ports_and_idle_rule(no_aws, capsys):
    write(no_aws, "workdir: null\nresources:\n  infra: aws/us-west-2\n  accelerators: L4:1\n  cpus: 8+\n"
                  "  image_id: {us-west-2: ami-050814f384259894c}\n  ports: 8000\n  autostop: 20\nrun: x\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["region"] == "us-west-2" and plan["ami"] == "ami-050814f384259894c"
    assert [r["instance_type"] for r in plan["instance_types"]] == ["g6.2xlarge"]
    assert [p["port"] for p in plan["ports"]] == [8000] and plan["idle_rule"]["minutes"] == 20


def test_the_infra_flag_reaches_the_loader_from_the_command_line(no_aws, capsys):
    write(no_aws, "workdir: null\nresources:\n  cloud: runpod\n  accelerators: L4:1\nrun: x\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json"]) == 2
    assert "--infra aws" in " ".join(capsys.readouterr().err.split())
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--infra", "aws"]) == 0
    assert json.loads(capsys.readouterr().out)["instance_types"][0]["instance_type"] == "g6.xlarge"
