"""What instances that ended themselves leave (issue 27, item 15): which runs' security groups,
key pairs and placement groups a later command removes, and which it must leave alone (pure)."""
from datetime import datetime, timedelta, timezone

from ec2gpu.aws import sweep
from ec2gpu.aws.instances import Instance

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)


def inst(run: str, state: str, reason: str = "") -> Instance:
    return Instance(f"i-{run}-{state}", "g4dn.xlarge", state, datetime.now(timezone.utc), tags={"ec2gpu:run": run},
                    state_reason_code=reason or None)


def key(run: str, age_s: float) -> dict:
    return {"KeyName": f"ec2gpu-{run}", "CreateTime": NOW - timedelta(seconds=age_s),
            "Tags": [{"Key": "ec2gpu:run", "Value": run}]}


def test_only_runs_whose_instances_all_ended_by_their_own_shutdown_or_long_ago_are_taken():
    described = [
        inst("self", "terminated", sweep.SELF_SHUTDOWN),  # --max-runtime or the idle rule fired
        inst("spot", "terminated", "Server.SpotInstanceTermination"),  # its controller may launch a replacement
        inst("user", "terminated", "Client.UserInitiatedShutdown"),  # `down` or the console: theirs to finish
        inst("half", "terminated", sweep.SELF_SHUTDOWN), inst("half", "running"),  # a node of it still runs
        inst("going", "shutting-down", sweep.SELF_SHUTDOWN),  # still holds its group
        inst("stopped", "stopped", sweep.SELF_SHUTDOWN),  # --idle-stop: it comes back with `start`
    ]
    keys = [key("old", 3 * 3600), key("young", 60)]  # "old": EC2 no longer lists its instances
    runs = {"self", "spot", "user", "half", "going", "stopped", "old", "young", "kept"}
    assert sweep.ended_runs(described + [inst("kept", "terminated", sweep.SELF_SHUTDOWN)], keys, runs, NOW,
                            keep={"kept"}) == {"self": "ended itself", "old": "no instance listed any more"}


def test_runs_a_live_controller_of_this_ledger_may_still_use_are_kept(tmp_path, monkeypatch):
    from ec2gpu.runs.settle import ledger
    from ec2gpu.runs.recover import reconcile
    from ec2gpu.runs.settle.record import new
    ledger.record(tmp_path, new("live", "ec2gpu run --spot", "aws", tmp_path))  # this process: alive
    gone = new("dead", "ec2gpu run", "aws", tmp_path)
    gone["controller"] = {**gone["controller"], "started": 1.0}  # a process that no longer exists
    ledger.record(tmp_path, gone)
    asked = {}
    monkeypatch.setattr(sweep, "ended_leftovers",
                        lambda ec2, keep, iam=None, autoscaling=None: asked.setdefault("keep", set(keep)) and {})
    reconcile.remove_ended(type("Aws", (), {"ec2": None, "client": lambda self, service: None})(), tmp_path, tmp_path,
                           keep={"named"})
    assert asked["keep"] == {"live", "named"}
