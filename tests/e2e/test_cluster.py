"""Multi-node training through torchrun in the sandbox, and standing clusters that grow and shrink."""
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import boto3
import pytest

from ec2gpu import cli
from ec2gpu.sandbox import sshd

from test_sandbox_train import leftovers, processes_gone, sandbox_settles  # same folder (pytest prepend import mode)
from test_spot_recovery import EC2GPU, drive

pytestmark = pytest.mark.e2e


def test_two_nodes_train_together_and_leave_nothing(sandbox_env, torchrun_port, tmp_path, capsys):
    home, _ = sandbox_env
    out = tmp_path / "run"
    code = cli.main(["train", "mnist", "--sandbox", "--nodes", "2", "--epochs", "1", "--out", str(out), "--json",
                     "--trainer-arg=--train-subset=20000"])  # what is tested is training together
    captured = capsys.readouterr()
    assert code == 0, captured.err
    record = json.loads(captured.out)
    summary = json.loads((out / "outputs" / "summary.json").read_text())
    assert record["status"] == "completed" and summary["test_acc"] >= 0.95  # learned, from 20,000 images
    assert summary["world_size"] == 2 and summary["nodes"] == 2
    assert [n["node_rank"] for n in summary["per_node"]] == [0, 1]
    assert all(n["samples_per_second"] > 0 for n in summary["per_node"])
    # every rank's lines reach the user, prefixed with their node
    assert re.search(r"node 0 \| \[rank 0\] .*epoch 1/1", captured.err)
    assert re.search(r"node 1 \| \[rank 1\] .*epoch 1/1", captured.err)
    assert "(head 127.0.0." in captured.err  # torchrun's rendezvous on node 0's (private) address
    assert len(record["instance_ids"]) == 2 and {a["node"] for a in record["attempts"]} == {0, 1}
    assert record["billed_seconds"] == sum(a["billed_seconds"] for a in record["attempts"])
    # the sandbox keeps placement groups as EC2 does (sandbox/placement.py): the run made its own and removed it
    said = " ".join(captured.err.split())  # lines wrapped at the terminal's width
    assert f"cluster placement group ec2gpu-{record['run_id']}" in said and "launching without" not in said
    assert f"placement groups ec2gpu-{record['run_id']}" in said  # removed, and said
    ec2 = boto3.client("ec2", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    assert ec2.describe_placement_groups(Filters=[{"Name": "tag-key", "Values": ["ec2gpu:run"]}])["PlacementGroups"] == []
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home)
    assert processes_gone(record["instance_ids"])


def trainer_pids(instance_id: str) -> list[int]:
    """The trainer worker processes (not torchrun itself) an instance runs."""
    pids = []
    for pid in sshd.instance_processes(instance_id):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ec2gpu.train.mnist" in cmd and b"ec2gpu.train.launch" not in cmd and not cmd[0].endswith(b"bash"):
            pids.append(pid)
    return pids


def test_killing_one_node_trainer_stops_the_run_cleanly(sandbox_env, torchrun_port, tmp_path):
    home, _ = sandbox_env
    killed, node = [], []

    def kill_rank_1(line, lines):
        node.append(int(re.search(r"node (\d) \| \[rank 1\]", line).group(1)))
        assert node == [1]  # static rendezvous: rank 0 on node 0, where the outputs come from
        instance = re.findall(r"launched (i-[0-9a-f]+), (i-[0-9a-f]+)", "".join(lines))[-1][node[0]]
        killed.extend(trainer_pids(instance))
        assert killed, f"node {node[0]} runs no trainer"
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
    code, _, err = drive(["train", "mnist", "--sandbox", "--nodes", "2", "--epochs", "1", "--out", str(tmp_path / "r")],
                         [(" | [rank 1]", kill_rank_1)], timeout_s=300)
    assert code == 5, err  # the job failed on an instance
    # the root cause from the agent record's torchelastic error (errorCode -9), not from log text
    said = " ".join(err.split())  # rich wraps long lines
    assert re.search(rf"error: the job on node {node[0]} \(i-[0-9a-f]+\) exited \d+ \(a worker died of SIGKILL\)",
                     said), err
    assert "Traceback (most recent call last)" not in err.split("error:")[-1]
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home)


def test_a_standing_cluster_grows_and_shrinks(sandbox_env, torchrun_port, tmp_path):
    home, state = sandbox_env
    env = dict(os.environ)

    def ec2gpu(*args) -> subprocess.CompletedProcess:
        at = args.index("--") if "--" in args else len(args)  # options go before `--`
        return subprocess.run([EC2GPU, *args[:at], "--sandbox", *args[at:]], env=env, capture_output=True, text=True,
                              timeout=180)

    def nodes() -> list[tuple[str, int]]:
        rows = json.loads(ec2gpu("ls", "--json").stdout)
        return sorted((r["name"], r["node"]) for r in rows if r["cluster"] == "lab")
    assert ec2gpu("launch", "--nodes", "2", "--name", "lab").returncode == 0
    try:
        assert nodes() == [("lab-0", 0), ("lab-1", 1)]
        ec2 = boto3.client("ec2", endpoint_url=state["endpoint"], region_name="us-east-1")
        (sg,) = {i["SecurityGroups"][0]["GroupId"] for r in ec2.describe_instances()["Reservations"]
                 for i in r["Instances"] if i["State"]["Name"] == "running"}
        rules = ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"][0]["IpPermissions"]
        assert any(p["IpProtocol"] == "-1" and p["UserIdGroupPairs"][0]["GroupId"] == sg for p in rules)
        # a run on the cluster as it stands (every node it has now), and the cluster stays up
        trained = ec2gpu("train", "mnist", "--cluster", "lab", "--epochs", "1", "--trainer-arg=--train-subset=6000",
                         "--out", str(tmp_path / "elastic"), "--json")
        assert trained.returncode == 0, trained.stderr
        assert "lab: 2 nodes; they keep running afterwards" in " ".join(trained.stderr.split())
        assert json.loads((tmp_path / "elastic" / "outputs" / "summary.json").read_text())["world_size"] == 2
        assert nodes() == [("lab-0", 0), ("lab-1", 1)]  # still up
        grown = ec2gpu("scale", "lab", "4", "--json")
        assert grown.returncode == 0, grown.stderr
        assert len(json.loads(grown.stdout)["added"]) == 2
        assert nodes() == [("lab-0", 0), ("lab-1", 1), ("lab-2", 2), ("lab-3", 3)]
        ssh = ec2gpu("ssh", "lab-3", "--", "echo", "ok")  # a new node is a real instance with an sshd
        assert ssh.returncode == 0 and ssh.stdout.strip() == "ok", ssh.stderr
        shrunk = ec2gpu("scale", "lab", "1")
        assert shrunk.returncode == 0 and "1 node now" in " ".join(shrunk.stdout.split())
        assert nodes() == [("lab-0", 0)]
        bad = ec2gpu("scale", "lab", "0")
        assert bad.returncode == 2 and "at least 1 node" in bad.stderr
    finally:
        assert ec2gpu("down", "lab").returncode == 0
    assert leftovers(home) == ([], [], [])
    assert sandbox_settles(home)
