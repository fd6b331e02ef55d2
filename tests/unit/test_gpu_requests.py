"""GPU requests as SkyPilot means them, on what EC2 sells: exact counts (and the allow_larger opt-in,
with the job limited to the GPUs asked), candidate lists (sets cheapest first, lists in order,
any_of, ordered), the GPU catalog and its names, and YAML read as SkyPilot reads it (issue 28)."""
import re

import pytest

from ec2gpu.aws import catalog, types
from ec2gpu.errors import UsageError
from ec2gpu.runs.execute import engine
from ec2gpu.tasks import load, resolve, skypilot


def _task(resources: str, extra: str = ""):
    return load.parse(f"name: t\nworkdir: null\nresources:\n{resources}run: x\n{extra}", "t.yaml")


def _types(loaded) -> list[str]:
    return resolve.instance_types(loaded.task.resources, "g4dn.xlarge")


# --- item 5: {A100:8}, a flow map without a space, is A100 x 8 ---

def test_a_flow_map_without_a_space_is_a_model_and_its_count():
    got = _task("  accelerators: {A100:8}\n")  # YAML reads {'A100:8': None}
    assert got.task.resources.gpu == "A100:8" and _types(got) == ["p4d.24xlarge"]
    assert _types(_task("  accelerators: {A10G: 4}\n")) == ["g5.12xlarge"]


# --- item 3: counts are exact ---

def test_one_a100_is_refused_in_one_line_naming_what_aws_sells_and_the_nearest_one_gpu_types():
    with pytest.raises(UsageError) as exc:
        _task("  accelerators: A100:1\n")
    msg = exc.value.message
    assert msg.startswith("t.yaml:4: resources.accelerators: no EC2 instance type has exactly 1 x A100")
    assert "8 x A100 (p4d.24xlarge, 21.96 USD/h)" in msg and "\n" not in msg
    assert "L40S 48 GiB (g6e.xlarge, 1.86 USD/h)" in msg and "H100 80 GiB (p5.4xlarge, 6.88 USD/h)" in msg
    assert "allow_larger: true" in exc.value.hint and "1 of its 8 GPUs" in exc.value.hint


def test_two_l4_do_not_silently_take_a_four_gpu_type():
    with pytest.raises(UsageError, match=r"exactly 2 x L4: AWS sells L4 as 1 x L4 \(g6.xlarge.*4 x L4 \(g6.12xlarge"):
        _task("  accelerators: L4:2\n")
    with pytest.raises(UsageError, match="exactly 2 x A10G"):  # ec2gpu's own gpu: field counts exactly too
        _task("  gpu: A10G:2\n")


def test_a_skypilot_model_alone_is_one_gpu_and_ours_alone_is_the_cheapest_type_with_it():
    assert _task("  accelerators: H100\n").task.resources.gpu == "H100:1"
    with pytest.raises(UsageError, match="exactly 1 x A100"):
        _task("  accelerators: A100\n")  # SkyPilot: A100 is A100:1
    got = _task("  gpu: A100\n")  # ec2gpu's field: that GPU in any count, all of its GPUs the job's
    assert _types(got) == ["p4d.24xlarge"]
    assert resolve.gpus_asked(got.task.resources, "p4d.24xlarge", 8) is None


def test_allow_larger_runs_on_the_larger_type_says_so_and_limits_the_job_to_the_gpus_asked():
    got = _task("  accelerators: A100:1\n  allow_larger: true\n")
    assert _types(got) == ["p4d.24xlarge"]
    [warning] = got.warnings
    assert "allow_larger: p4d.24xlarge (8 x A100" in warning and "CUDA_VISIBLE_DEVICES=0," in warning
    job = engine.prepare(got, {})
    for itype in ("p4d.24xlarge", None):  # the node's type, or (a caller that does not know it) its GPU count
        env = engine.node_env(job, "r", "/home/u/ec2gpu/runs/r", 0, ["10.0.0.1"], 8, False, instance_type=itype)
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == env["EC2GPU_GPUS_PER_NODE"] == "1"
    two = engine.prepare(_task("  accelerators: L4:2\n  allow_larger: true\n"), {})
    env = engine.node_env(two, "r", "/home/u/ec2gpu/runs/r", 0, ["10.0.0.1"], 4, False, instance_type="g6.12xlarge")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["SKYPILOT_NUM_GPUS_PER_NODE"] == "2"


def test_an_exact_type_sees_all_its_gpus_and_no_cuda_visible_devices_is_set():
    job = engine.prepare(_task("  accelerators: A10G:4\n  allow_larger: true\n"), {})
    env = engine.node_env(job, "r", "/home/u/ec2gpu/runs/r", 0, ["10.0.0.1"], 4, False, instance_type="g5.12xlarge")
    assert "CUDA_VISIBLE_DEVICES" not in env and env["SKYPILOT_NUM_GPUS_PER_NODE"] == "4"


# --- item 4: several candidates ---

def test_a_set_of_accelerators_is_tried_cheapest_first_and_a_list_in_order():
    assert _types(_task("  accelerators: {H200:8, H100:8}\n")) == ["p5.48xlarge", "p5en.48xlarge"]
    assert _types(_task("  accelerators: [H200:8, H100:8]\n")) == ["p5en.48xlarge", "p5.48xlarge"]
    assert _types(_task("  accelerators: {A100: 8, H100: 8}\n")) == ["p4d.24xlarge", "p5.48xlarge"]


def test_any_of_and_ordered_become_the_fallback_list_and_never_drop_the_gpu():
    any_of = "  any_of:\n    - accelerators: H100:8\n    - accelerators: A100-80GB:8\n      use_spot: true\n"
    got = _task(any_of)
    assert _types(got) == ["p4de.24xlarge", "p5.48xlarge"] and got.task.resources.spot
    assert not [w for w in got.warnings if w.startswith("ignored SkyPilot")]  # supported: nothing named as dropped
    assert got.warnings == ["resources.any_of: the candidates differ in use_spot; ec2gpu runs a run on one market: "
                            "spot, as one asks (the cheaper market) (--spot-fallback on-demand adds on-demand after "
                            "spot)"]
    ordered = "  ordered:\n    - instance_type: p5.48xlarge\n    - accelerators: L40S:1\n"
    assert _types(_task(ordered)) == ["p5.48xlarge", "g6e.xlarge"]
    inherit = "  accelerators: A100:8\n  ordered:\n    - infra: aws/us-east-1\n    - infra: aws/us-west-2\n"
    assert _types(_task(inherit)) == ["p4d.24xlarge"]  # candidates without accelerators take the resources'


def test_ec2gpus_own_format_has_the_same_candidate_lists():
    got = _task("  ordered:\n    - gpu: H200:8\n    - instance_type: p5.48xlarge\n")
    assert not got.skypilot and _types(got) == ["p5en.48xlarge", "p5.48xlarge"]
    got = _task("  gpu: L4:1\n  any_of:\n    - gpu: A10G:1\n    - {}\n")  # {}: the resources' own gpu
    assert _types(got) == ["g6.xlarge", "g5.xlarge"]
    with pytest.raises(UsageError, match="any_of and ordered together"):
        _task("  any_of: [{gpu: T4}]\n  ordered: [{gpu: L4}]\n")


def test_a_candidate_ec2_cannot_run_is_skipped_for_the_next_and_named():
    got = _task("  accelerators: [H100-MEGA:8, tpu-v4-8, MI300:8, RTX4090:1, H100:8]\n")
    assert _types(got) == ["p5.48xlarge"]
    [warning] = got.warnings
    for why in ("H100-MEGA:8: H100-MEGA is not a GPU ec2gpu can run: GCP's a3-megagpu-8g", "Google Cloud TPU",
                "AMD Instinct", "a consumer card EC2 does not sell"):
        assert why in warning
    got = _task("  any_of:\n    - infra: gcp/us-central1\n      accelerators: H100:8\n"
                "    - instance_type: p5e.48xlarge\n    - accelerators: A100:8\n")
    assert _types(got) == ["p4d.24xlarge"]
    assert any("another cloud skipped: [0] infra: gcp/us-central1" in w for w in got.warnings)
    assert any("p5e.48xlarge" in w and "Capacity Blocks" in w for w in got.warnings)


def test_when_no_candidate_is_left_the_task_is_refused_with_each_reason():
    with pytest.raises(UsageError, match=r"t\.yaml:4: resources.any_of: no candidate .*A100:1: no EC2 .*L4:2: no EC2"):
        _task("  any_of:\n    - accelerators: A100:1\n    - accelerators: L4:2\n")


def test_candidates_that_differ_in_use_spot_run_on_the_first_ones_market_with_a_warning():
    got = _task("  accelerators: A100:8\n  ordered:\n    - use_spot: true\n    - use_spot: false\n")
    assert got.task.resources.spot and any("differ in use_spot" in w for w in got.warnings)


# --- item 7: the catalog and the names ---

@pytest.mark.parametrize("asked, itype", [
    ("L40S:1", "g6e.xlarge"), ("L40S:8", "g6e.48xlarge"), ("A100-80GB:8", "p4de.24xlarge"),
    ("A100-80GB-SXM:8", "p4de.24xlarge"), ("H100-SXM:8", "p5.48xlarge"), ("H100:1", "p5.4xlarge"),
    ("H200:8", "p5en.48xlarge"), ("h200-sxm:8", "p5en.48xlarge"), ("B200:8", "p6-b200.48xlarge"),
    ("a10g:1", "g5.xlarge"), ("A10g:4", "g5.12xlarge"), ("L4:1", "g6.xlarge"), ("T4:4", "g4dn.12xlarge")])
def test_the_catalog_covers_what_ec2_sells_under_skypilots_and_others_names(asked, itype):
    assert resolve.instance_type_for_gpu(asked) == itype


@pytest.mark.parametrize("asked, why", [
    ("H100-MEGA:8", "GCP's a3-megagpu-8g"), ("Inferentia2:1", "Neuron SDK, not CUDA"),
    ("Trainium:16", "Neuron SDK"), ("tpu-v5p-8", "Google Cloud TPU"), ("MI300:8", "AMD Instinct"),
    ("MI250:1", "AMD Instinct"), ("RTX4090:1", "consumer card"), ("RTX3090:1", "consumer card"),
    ("A4000:1", "workstation card"), ("A5000:1", "workstation card"), ("A6000:1", "workstation card"),
    ("RTXA6000:1", "workstation card"), ("A40:1", "does not sell"), ("A10:1", r"the A10G \(g5\)"),
    ("L40:1", r"the L40S \(g6e\)"), ("V100:1", "p3 instances only"), ("K80:1", "Kepler")])
def test_hardware_ec2_does_not_sell_is_refused_with_a_reason(asked, why):
    with pytest.raises(UsageError, match=why):
        resolve.instance_type_for_gpu(asked)


def test_new_rows_cite_their_price_source_and_p5e_has_no_on_demand_price():
    price = catalog.on_demand_price("g6e.xlarge", "us-east-1")
    assert price.usd_per_hour == 1.861 and "SkyPilot's catalog" in price.source
    assert "2025-06" in catalog.on_demand_price("g4dn.xlarge", "us-east-1").source
    with pytest.raises(UsageError, match="Capacity Blocks") as exc:
        catalog.lookup("p5e.48xlarge")
    assert exc.value.hint == "use --instance-type p5en.48xlarge"
    assert types.gpu_name("A100", 81920) == "A100-80GB" and types.gpu_name("A100", 40960) == "A100"


def test_skypilots_memory_form_is_every_gpu_with_that_memory_cheapest_first():
    assert _types(_task("  accelerators: 80GB+:8\n"))[:2] == ["p4de.24xlarge", "p5.48xlarge"]
    assert _types(_task("  accelerators: 24GB:1\n")) == ["g6.xlarge", "g5.xlarge"]


def test_a_fractional_count_is_named_as_such():
    with pytest.raises(UsageError, match=r"t\.yaml:4: resources.accelerators: 'T4:0.5': a fractional count"):
        _task("  accelerators: T4:0.5\n")


# --- item 10: YAML as SkyPilot reads it ---

def test_a_key_given_twice_is_refused_with_its_line():
    with pytest.raises(UsageError, match=r"t\.yaml:3: envs\.A: given twice \(first at line 2\)"):
        load.parse("envs:\n  A: 1\n  A: 2\nrun: x\n", "t.yaml")
    got = load.parse("workdir: null\nenvs: {<<: {B: 1, C: 1}, B: 2}\nrun: x\n", "t.yaml")
    assert got.task.envs == {"B": "2", "C": "1"}  # a key merged in with <<: may be overridden: merging is for that


def test_skypilots_git_workdir_is_cloned_on_the_instance_and_a_bad_one_refused():
    got = load.parse("name: t\nworkdir:\n  url: https://github.com/o/r\n  ref: v1\nrun: x\n", "t.yaml")
    assert got.git == {"url": "https://github.com/o/r", "ref": "v1"} and got.workdir is None
    assert load.parse("workdir: {url: 'git@github.com:o/r.git'}\nrun: x\n", "t.yaml").git["ref"] is None
    for bad, words in (("{url: '-oProxyCommand=x'}", "not a git repository URL"),
                       ("{url: '-oProxyCommand=x@h:r'}", "not a git repository URL"),
                       ("{url: 'u@-oProxyCommand=x:r'}", "not a git repository URL"),
                       ("{url: 'ssh://-oProxyCommand=x/r'}", "not a git repository URL"),
                       ("{url: 'https://h/r', ref: '--upload-pack=x'}", "not a branch"),
                       ("{url: 'https://h/r', branch: main}", "unknown field")):
        with pytest.raises(UsageError, match=words):
            load.parse(f"workdir: {bad}\nrun: x\n", "t.yaml")


# --- item 11 ---

def test_several_documents_are_refused_as_a_pipeline_not_as_bad_yaml():
    with pytest.raises(UsageError) as exc:
        load.parse("name: pipe\n---\nname: a\nrun: x\n---\nname: b\nrun: y\n", "p.yaml")
    assert exc.value.message.startswith("p.yaml:3: 3 YAML documents (---): a SkyPilot pipeline or job group; "
                                        "ec2gpu runs one task per file")
    assert "not valid YAML" not in exc.value.message
    assert load.parse("---\nrun: x\nworkdir: null\n---\n", "t.yaml").task.run == "x"  # one task, empty trailer


def test_skypilots_legacy_outputs_is_recognised_and_named_as_what_it_is():
    got = load.parse("workdir: null\nrun: x\noutputs: {s3://bucket/out: 10}\ninputs: {s3://bucket/in: 1}\n", "t.yaml")
    assert got.skypilot and got.task.outputs == []
    [warning] = [w for w in got.warnings if "inputs" in w]
    assert "inputs" in warning and "outputs (SkyPilot's legacy {bucket: size in GB}" in warning
    assert "moves no data" in warning


def test_an_unknown_field_is_hinted_with_skypilots_names_and_the_closest_one():
    with pytest.raises(UsageError, match=r"t\.yaml:3: resources\.acelerators: unknown field") as exc:
        load.parse("workdir: null\nresources:\n  acelerators: T4:1\nrun: x\n", "t.yaml")
    assert exc.value.hint.startswith("did you mean accelerators?")
    assert "SkyPilot's (read, mapped or warned about): infra, cloud" in exc.value.hint
    assert "allow_larger" in exc.value.hint
    with pytest.raises(UsageError, match="unknown field") as exc:
        load.parse("workdir: null\nfile_mount: {}\nrun: x\n", "t.yaml")
    assert "did you mean file_mounts?" in exc.value.hint and "num_nodes" in exc.value.hint


def test_supported_fields_are_no_longer_in_the_dropped_lists():
    assert not {"any_of", "ordered", "accelerators", "gpus"} & skypilot.SKYPILOT_UNSUPPORTED_RESOURCES


# --- what SkyPilot does without a field ---

def test_a_skypilot_file_without_workdir_sends_nothing_as_skypilot_does(tmp_path):
    got = load.parse("resources:\n  accelerators: T4:1\nrun: nvidia-smi\n", "t.yaml", tmp_path)
    assert got.skypilot and got.workdir is None and got.warnings == []


def test_a_plain_file_without_workdir_sends_its_directory_and_says_so(tmp_path):
    got = load.parse("resources:\n  gpu: T4\nrun: python train.py\n", "t.yaml", tmp_path)
    assert got.workdir == tmp_path.resolve()
    [warning] = got.warnings
    assert "no workdir: in the file, so its directory is sent" in warning and "workdir: null" in warning


@pytest.mark.parametrize("text, skypilot", [
    ("workdir: null\nrun: x\n", False),
    ("workdir: null\nnum_nodes: 1\nrun: x\n", True),
    ("workdir: null\nresources:\n  disk_size: 200\n  any_of:\n    - use_spot: true\n    - use_spot: false\nrun: x\n", True),
])
def test_no_gpu_asked_runs_on_the_default_gpu_type_and_says_skypilot_would_not(text, skypilot):
    got = load.parse(text, "t.yaml")
    assert got.skypilot is skypilot
    assert any("runs on its default GPU type" in w and "SkyPilot would choose a CPU instance" in w
               for w in got.warnings)
    assert not any("default GPU type" in w for w in load.parse("workdir: null\nresources:\n  gpu: L4\nrun: x\n",
                                                                  "t.yaml").warnings)


@pytest.mark.parametrize("name", ["n1-highmem-8", "VM.Standard.E4.Flex", "Standard_NC6s_v3", "g5"])
def test_an_instance_type_that_is_not_an_ec2_name_is_refused_before_anything(name):
    with pytest.raises(UsageError, match=rf"t\.yaml:2: resources\.instance_type: '{re.escape(name)}' is not an EC2 "
                                         "instance type name"):
        load.parse(f"resources:\n  instance_type: {name}\nrun: x\n", "t.yaml")


@pytest.mark.parametrize("size, gib", [("1024GB", 1024), ("1TB", 1024), ("256", 256), (512, 512)])
def test_skypilots_disk_size_with_a_unit_is_gib_as_ec2_reads_it(size, gib):
    assert _task(f"  accelerators: T4:1\n  disk_size: {size}\n").task.resources.disk_gib == gib


def test_a_workdir_under_home_written_with_a_tilde_is_this_machines_home_not_a_folder_named_tilde(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "proj").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"workdir: .*/home/proj is outside .*the task file's directory"):
        load.parse("workdir: ~/proj\nrun: x\n", "t.yaml", tmp_path / "tasks")


@pytest.mark.parametrize("name, said", [("m5.8xlarge", "m5.8xlarge has no NVIDIA GPU"),
                                        ("p3.2xlarge", "p3.2xlarge is no longer offered")])
def test_an_ec2_type_the_run_would_refuse_is_refused_when_the_file_is_read(name, said):
    with pytest.raises(UsageError, match=rf"t\.yaml:2: resources\.instance_type: {re.escape(said)}"):
        load.parse(f"resources:\n  instance_type: {name}\nrun: x\n", "t.yaml")
