"""A detached run of two nodes in the sandbox (issue 30, "What the user gets" 3): torchrun over
the Auto Scaling group's two instances, the worker interrupted with nobody watching; the group's
replacement joins, both nodes start again from the head's checkpoint in S3 with the new
SKYPILOT_NODE_IPS, and the run finishes; nothing of it is left."""
import json
import time

import pytest

from ec2gpu import api, cli

from test_detached_run import _client, _nothing_left, _object, _prefix, _wait  # same folder (pytest prepend import mode)

pytestmark = pytest.mark.e2e

STEPS = 30
TRAIN = f'''import json, os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = Path(os.environ["EC2GPU_CHECKPOINT_DIR"]) / "step.txt"
start = int(ckpt.read_text()) if os.environ.get("EC2GPU_RESUME") == "1" and ckpt.exists() else 0
print(f"rank {{rank}} of {{world}} starts at step {{start}}", flush=True)
for step in range(start, {STEPS}):
    t = torch.ones(1)
    dist.all_reduce(t)  # every step needs both nodes
    assert t.item() == world
    time.sleep(0.5)
    if rank == 0:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        ckpt.with_suffix(".tmp").write_text(str(step + 1))
        ckpt.with_suffix(".tmp").replace(ckpt)
        print(f"step {{step + 1}} world {{world}}", flush=True)
if rank == 0:
    out = Path(os.environ["EC2GPU_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({{"world_size": world, "started_at_step": start,
                                                  "ips": os.environ["SKYPILOT_NODE_IPS"].split()}}))
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
'''
TASK = """name: ddp-detached
workdir: .
run: |
  python3 -m torch.distributed.run --nnodes "$SKYPILOT_NUM_NODES" --nproc-per-node 1 \\
    --node-rank "$SKYPILOT_NODE_RANK" --master-addr "$EC2GPU_HEAD_IP" --master-port 29517 \\
    --local-addr "$EC2GPU_NODE_IP" train.py
nodes: 2
"""


def _gang(bucket: str, run_id: str) -> dict:
    try:
        return json.loads(_object(bucket, _prefix(run_id) + "gang.json"))
    except _client("s3").exceptions.NoSuchKey:
        return {}


def _placed(instance_ids: list[str]) -> set[tuple[str, str]]:
    """{(zone, placement group)} of the instances (EC2 keeps a terminated one's for a while)."""
    found = _client("ec2").describe_instances(InstanceIds=instance_ids)["Reservations"]
    return {(i["Placement"]["AvailabilityZone"], i["Placement"].get("GroupName", "")) for r in found
            for i in r["Instances"]}


@pytest.mark.parametrize("lost", [1, 0], ids=["worker", "head"])
def test_a_detached_run_of_two_nodes_restarts_both_when_one_is_replaced(sandbox_env, tmp_path, capsys, lost):
    """``lost``: the rank of the node interrupted. The head lost, the worker heads the next
    generation and carries the run's record and log on. Its rendezvous port, 29517, is its own:
    the other multi-node tests share 29500 under a lock (conftest.torchrun_port), which this one
    need not wait for."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "task.yaml").write_text(TASK)
    assert cli.main(["run", str(work / "task.yaml"), "--sandbox", "--detach", "--spot", "--max-runtime", "30m",
                     "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    run_id, bucket = record["run_id"], record["bucket"]
    _wait(run_id, ("running",), timeout_s=240)
    first = _gang(bucket, run_id)
    assert first["generation"] == 1 and len(first["members"]) == 2
    # one zone, the run's cluster placement group, and AZRebalance suspended (issue 51 item 3)
    ((zone, placement_group),) = _placed(first["members"])
    assert placement_group == f"ec2gpu-{run_id}"
    (group,) = _client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[record["group"]])["AutoScalingGroups"]
    assert len(group["VPCZoneIdentifier"].split(",")) == 1
    assert [p["ProcessName"] for p in group["SuspendedProcesses"]] == ["AZRebalance"]
    head_log = (sandbox_env[0] / "sandbox" / "instances" / first["members"][0] / "state" / "detached" / "ec2gpu"
                / "runs" / run_id / "job.log")
    deadline = time.monotonic() + 120
    while "step 3 world 2" not in (head_log.read_text(errors="replace") if head_log.exists() else ""):
        assert time.monotonic() < deadline, head_log.read_text(errors="replace")[-2000:] if head_log.exists() else ""
        time.sleep(0.5)  # three steps in, each checkpointed by the head
    # a notice long enough for the agent to see it (it looks every 5 s) and say "leaving": on AWS it is 2 min
    api.sandbox_interrupt(first["members"][lost], notice_seconds=10)
    done = _wait(run_id, ("succeeded", "failed", "cancelled"), timeout_s=400)
    last = _gang(bucket, run_id)
    log = _object(bucket, _prefix(run_id) + "logs/job.log")
    agents = "".join(p.read_text(errors="replace")[-3000:] for p in
                     (sandbox_env[0] / "sandbox" / "instances").glob("*/state/detached/detached.log"))
    assert done["state"] == "succeeded" and done["interruptions"] == 1, f"{done} {last} {log[-3000:]} {agents}"
    kept = first["members"][1 - lost]
    assert last["generation"] == 2 and last["reason"] == "interruption" and last["members"][0] == kept
    assert first["members"][lost] not in last["members"] and first["ips"][lost] not in last["ips"]
    assert done["instance_id"] == kept  # the head of generation 2 wrote the end
    assert "starts at step 0" in log and "step 1 world 2" in log  # generation 1's head's log, carried on
    summary = json.loads(_object(bucket, _prefix(run_id) + "outputs/summary.json"))
    assert summary["world_size"] == 2 and summary["ips"] == last["ips"]  # the new SKYPILOT_NODE_IPS
    assert 0 < summary["started_at_step"] < STEPS, agents  # resumed from the head's checkpoint
    assert done["launches"] == 3
    assert _placed(last["members"]) == {(zone, placement_group)}  # the replacement too
    left = _nothing_left(run_id)
    assert not any(left.values()), left
