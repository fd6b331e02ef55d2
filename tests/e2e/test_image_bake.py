"""`ec2gpu image bake|ls|rm` in the sandbox: an image holds a task's setup, runs launch from it and
skip that setup, and a bake stopped at any moment (Ctrl-C, an error, a lost CreateImage answer)
leaves no builder, no half-made image and no snapshot."""
import json
import os
import textwrap
from pathlib import Path

import boto3
import pytest

from ec2gpu import cli
from ec2gpu.aws import baked
from ec2gpu.errors import WaitTimeout
from ec2gpu.runs.provision import bake
from ec2gpu.sandbox import control

from test_interrupts import run_and_interrupt  # same folder (pytest prepend import mode)
from test_sandbox_train import leftovers, processes_gone, sandbox_settles

pytestmark = pytest.mark.e2e
NEEDS_MNIST = False
SECRET = "image-secret-7319"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A task whose setup takes a while and leaves a file the job checks."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text("import os\nprint('deps from', open(os.path.expanduser('~/deps/installed')).read())\n")
    (root / "task.yaml").write_text(textwrap.dedent("""\
        name: baked
        setup: |
          echo installing; sleep 3; mkdir -p $HOME/deps && date -u > $HOME/deps/installed
        run: python3 train.py
        envs:
          TOKEN:
        secrets: [TOKEN]
        """))
    monkeypatch.setenv("TOKEN", SECRET)
    monkeypatch.chdir(root)
    return root


def ec2():
    return boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def images_and_snapshots() -> tuple[list, list]:
    """Every image and snapshot carrying the tool's image tag, complete or not."""
    client = ec2()
    imgs = client.describe_images(Owners=["self"], Filters=[{"Name": "tag-key", "Values": [baked.IMAGE]}])["Images"]
    snaps = client.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "tag-key", "Values": [baked.IMAGE]}])
    return [i["ImageId"] for i in imgs], [s["SnapshotId"] for s in snaps["Snapshots"]]


def nothing_left(home, record=None) -> None:
    assert leftovers(home) == ([], [], [])
    assert images_and_snapshots() == ([], [])
    assert sandbox_settles(home)
    if record:
        assert processes_gone(record["instance_ids"])


def run_json(capsys, argv) -> tuple[int, dict | None, str]:
    code = cli.main([*argv, "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


def test_a_baked_image_holds_the_setup_runs_skip_it_and_rm_leaves_nothing(sandbox_env, project, capsys):
    home, _ = sandbox_env
    code, record, err = run_json(capsys, ["image", "bake", "task.yaml", "--sandbox"])
    assert code == 0, err
    image_id = record["summary"]["image_id"]
    assert record["task"] == "bake" and record["status"] == "completed" and record["cost_usd"] > 0
    assert "installing" in err and "cleaned for the image" in err
    tags = {t["Key"]: t["Value"] for t in ec2().describe_images(ImageIds=[image_id])["Images"][0]["Tags"]}
    assert tags[baked.BAKE] == "complete" and tags[baked.SETUP_HASH] == record["summary"]["setup_hash"]
    assert tags[baked.BASE] == "dlami" and tags["ec2gpu:torch"] and tags["ec2gpu:run"] == record["run_id"]
    assert leftovers(home) == ([], [], [])  # the builder, its group and key pair are gone
    disk = home / "sandbox" / "images" / image_id / "home"  # what the image holds (sandbox/images.py)
    assert (disk / "deps" / "installed").is_file() and (disk / ".ec2gpu" / "baked-setup.json").is_file()
    assert not (disk / "ec2gpu" / "runs").exists()  # the run directory (the job's environment file) is not
    assert not [p for p in disk.rglob("*") if p.name in (".bash_history", "authorized_keys", "credentials")
                or p.name.startswith("id_") and not p.name.endswith(".pub")]
    assert not [p for p in disk.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]  # nor a secret

    # a run of the task launches from it: machine setup only checks, the task's setup is skipped
    code, run, err = run_json(capsys, ["run", "task.yaml", "--sandbox", "--expect", "1m"])
    assert code == 0, err
    assert f"AMI {image_id}" in " ".join(err.split()) and "baked into image" in " ".join(err.split())
    assert "installing" not in err and run["phases"]["setup"] < 2.0
    assert (Path(run["artifacts"]) / "job.log").read_text().startswith("deps from")
    # --no-baked boots the Deep Learning AMI and sets up as before
    code, cold, err = run_json(capsys, ["run", "task.yaml", "--sandbox", "--expect", "1m", "--no-baked"])
    assert code == 0 and "installing" in err and image_id not in err and cold["phases"]["setup"] > 3.0

    code, rows, _ = run_json(capsys, ["image", "ls", "--sandbox"])
    assert code == 0 and [r["image_id"] for r in rows] == [image_id]
    assert rows[0]["snapshot_gib"] > 0 and rows[0]["usd_per_month"] == pytest.approx(
        rows[0]["snapshot_gib"] * baked.SNAPSHOT_USD_PER_GB_MONTH, abs=1e-3)
    code, removed, _ = run_json(capsys, ["image", "rm", rows[0]["name"], "--sandbox"])
    assert code == 0 and removed["snapshots"] == rows[0]["snapshots"]
    nothing_left(home, run)
    assert cli.main(["image", "rm", image_id, "--sandbox"]) == 2  # gone: one line, exit 2
    assert "no image of ec2gpu's named" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("phase", ["setup", "cleaning", "imaging", "waiting for image"])
def test_ctrl_c_at_any_moment_of_a_bake_leaves_nothing(sandbox_env, project, phase):
    home, _ = sandbox_env
    code, err = run_and_interrupt(dict(os.environ), f"pausing in phase {phase}", pause_in=phase,
                                  argv=["image", "bake", "task.yaml", "--sandbox"])
    assert code == 130, err
    if phase in ("imaging", "waiting for image"):  # the image existed and was taken back
        assert "deregistered ami-" in err and "deleted snapshot snap-" in err
    nothing_left(home)


def test_an_image_that_never_becomes_available_is_removed_with_its_snapshot(sandbox_env, project, capsys,
                                                                            monkeypatch):
    home, _ = sandbox_env

    def never(ec2_, image_id, *a, **k):
        raise WaitTimeout(f"image {image_id} not available after 1800 s (state pending)", "bake again later")
    monkeypatch.setattr(baked, "wait_available", never)
    assert cli.main(["image", "bake", "task.yaml", "--sandbox"]) == 6  # a wait ran past its bound
    assert "not available after" in capsys.readouterr().err
    nothing_left(home)


def test_a_createimage_whose_answer_was_lost_is_found_by_its_tags_and_removed(sandbox_env, project, monkeypatch):
    home, _ = sandbox_env
    create = baked.create

    def lost(*args, **kwargs):  # EC2 made the image, the answer never came back: Ctrl-C meanwhile
        create(*args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(baked, "create", lost)
    assert cli.main(["image", "bake", "task.yaml", "--sandbox"]) == 130
    nothing_left(home)


def test_a_bake_from_bare_ubuntu_installs_the_driver_reboots_when_asked_and_runs_use_it(sandbox_env, project, capsys,
                                                                                      tmp_path, monkeypatch):
    """The driver install asks for a reboot until the instance really rebooted (its boot id
    changed): this machine has no GPU, so a stand-in plays ami/install-cuda.sh's part (its own
    branches are tests/unit/test_install_cuda.py)."""
    home, _ = sandbox_env
    ami = tmp_path / "ami"
    ami.mkdir()
    (ami / "clean-for-image.sh").write_text((bake.AMI_DIR / "clean-for-image.sh").read_text())
    (ami / "install-cuda.sh").write_text(textwrap.dedent("""\
        first=$HOME/first-boot-id
        if [ ! -f "$first" ]; then cat "$EC2GPU_BOOT_ID_FILE" > "$first"; echo "driver installed"; exit 100; fi
        if [ "$(cat "$EC2GPU_BOOT_ID_FILE")" != "$(cat "$first")" ]; then echo "driver loaded"; exit 0; fi
        exit 100
        """))
    monkeypatch.setattr(bake, "AMI_DIR", ami)
    shutdowns = []  # when the builder's OS will power off (sandbox state.json), each time the driver script runs
    run_script = bake.run_script

    def watched(nd, script, args, log, ok=(0,)):
        if script == "install-cuda.sh":
            state = json.loads((control.state_dir(home) / "state.json").read_text())
            shutdowns.append((args, state["shutdowns"].get(nd.instance_id)))
        return run_script(nd, script, args, log, ok)
    monkeypatch.setattr(bake, "run_script", watched)
    code, record, err = run_json(capsys, ["image", "bake", "task.yaml", "--sandbox", "--from", "ubuntu-24.04"])
    assert code == 0, err
    said = " ".join(err.split())
    assert "Canonical's Ubuntu 24.04" in said and "RebootInstances" in said and "is back from its reboot" in said
    assert "driver loaded" in said and record["phases"]["driver"] > 0
    assert record["summary"]["base"] == "ubuntu-24.04"
    # the reboot forgot user data's `shutdown -h +120`: it was armed again, for the time left, not 120 min more
    (first_args, first), (_, again) = shutdowns
    assert first_args == ["g4dn.xlarge", "0"]  # a sandbox instance has none of its type's GPUs
    assert first and again and again <= first and "armed again" in said

    code, run, err = run_json(capsys, ["run", "task.yaml", "--sandbox", "--expect", "1m"])
    assert code == 0 and record["summary"]["image_id"] in err

    # an image deregistered without its snapshot (an `image rm` stopped in between): cleanup finds the
    # snapshot by its bake tag although it says complete
    image_id = record["summary"]["image_id"]
    (snap,) = record["summary"]["snapshots"]
    assert {"Key": baked.BAKE, "Value": "complete"} in \
        ec2().describe_snapshots(SnapshotIds=[snap])["Snapshots"][0]["Tags"]
    ec2().deregister_image(ImageId=image_id)
    assert cli.main(["cleanup", "--sandbox"]) == 0
    assert snap in capsys.readouterr().out
    nothing_left(home, run)


def test_the_bake_key_is_the_builtin_task_and_the_setup_text():
    from ec2gpu.runs.execute import engine
    mnist = engine.builtin_job("mnist", [])
    assert bake.bake_key(mnist) == bake.bake_key(engine.builtin_job("mnist", ["--epochs", "3"]))  # flags do not matter
    other = engine.builtin_job("bench", [])
    assert bake.bake_key(other) != bake.bake_key(mnist)

