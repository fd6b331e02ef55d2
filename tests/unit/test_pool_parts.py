"""The pool's pure parts (ec2gpu/pool/): the driver's status read as hostile input, which workers
the pool lets go, each element's cost share, a Ray node's command line and ports, the driver's
output packing, and the refusals of `run --array` / `train mnist --sweep` before anything starts."""
import argparse
import io
import json
import os
import socket
import tarfile
from dataclasses import replace

import pytest

from ec2gpu import api, cli
from ec2gpu.aws import catalog
from ec2gpu.errors import UsageError
from ec2gpu.pool import attempt, driver, follow, node
from ec2gpu.runs import element_table as records  # its home since runs/ stopped importing pool/
from ec2gpu.tasks import arrays

SUBMITTED = [e.as_dict() for e in arrays.elements(None, {"lr": [0.1, 0.2]})]


def status(**over):
    base = {"schema": 1, "final": False, "at": 1.8e9, "counts": {"done": 1, "failed": 0, "running": 1, "queued": 0},
            "nodes": {"10.0.0.1": 1, "10.0.0.2": 0},
            "elements": [{"index": 0, "status": "succeeded", "attempts": 1, "exit_status": 0, "node": "10.0.0.1",
                          "nodes": ["10.0.0.1"], "seconds": 3.5, "ended_at": 1.8e9, "tail": ["ok"], "params": {}},
                         {"index": 1, "status": "running", "attempts": 2, "node": None, "nodes": ["a", "b"],
                          "tail": []}]}
    base.update(over)
    return json.dumps(base).encode()


def test_the_driver_status_is_checked_and_the_params_are_what_was_submitted():
    got = records.parse_status(status(), SUBMITTED)
    assert got["counts"] == {"done": 1, "failed": 0, "running": 1, "queued": 0}
    assert [e["params"] for e in got["elements"]] == [{"lr": "0.1"}, {"lr": "0.2"}]  # ours, not the file's
    assert got["elements"][1]["attempts"] == 2 and got["elements"][0]["tail"] == ["ok"]


@pytest.mark.parametrize("bad, says", [
    ({"schema": 2}, "schema 1"), ({"counts": []}, "counts"), ({"counts": {"done": -1}}, "counts.done"),
    ({"nodes": {str(i): 0 for i in range(300)}}, "256"), ({"elements": [{"index": 7, "status": "queued"}]},
                                                              "not submitted"),
    ({"elements": [{"index": 0, "status": "won"}]}, "status"),
    ({"elements": [{"index": 0, "status": "queued", "attempts": True}]}, "attempts"),
    ({"elements": [{"index": 0, "status": "queued", "seconds": float("nan")}]}, "NaN is not a number"),  # the reader's
    ({"elements": [{"index": 0, "status": "queued", "ended_at": 12}]}, "not a time"),
    ({"elements": [{"index": 0, "status": "queued", "tail": "x"}]}, "tail"),
])
def test_a_hostile_status_is_refused(bad, says):
    with pytest.raises(records.BadStatus, match=says):
        records.parse_status(status(**bad), SUBMITTED)


def test_a_status_read_without_the_submitted_elements_takes_their_own_params_checked():
    """`ec2gpu fetch` on another machine knows no task: each record's own parameters, as bounded text."""
    got = records.parse_status(status(elements=[{"index": 5, "status": "succeeded", "params": {"lr": "x" * 9000}}]),
                               None)
    assert got["elements"][0]["index"] == 5 and got["elements"][0]["params"] == {"lr": "x" * records.MAX_LINE_CHARS}
    for bad in ([1], {"lr": 3}, {str(k): "1" for k in range(40)}):
        with pytest.raises(records.BadStatus, match="param"):
            records.parse_status(status(elements=[{"index": 0, "status": "queued", "params": bad}]), None)


def test_a_status_too_large_or_not_json_is_refused():
    with pytest.raises(records.BadStatus, match="at most"):
        records.parse_status(b" " * (records.MAX_STATUS_BYTES + 1), SUBMITTED)
    with pytest.raises(records.BadStatus, match="not JSON"):
        records.parse_status(b"\xff{", SUBMITTED)


def test_long_lines_and_tails_are_bounded():
    long = {"index": 0, "status": "failed", "tail": ["x" * 10_000] * 50, "error": "e" * 500}
    got = records.parse_status(status(elements=[long]), SUBMITTED)["elements"][0]
    assert len(got["tail"]) == records.MAX_TAIL_LINES and len(got["tail"][0]) == records.MAX_LINE_CHARS
    assert len(got["error"]) == 120


def test_a_worker_is_let_go_only_when_nothing_waits_and_it_runs_nothing():
    workers = {"i-1": "10.0.0.1", "i-2": "10.0.0.2", "i-3": "10.0.0.3"}
    drained = {"counts": {"queued": 0}, "nodes": {"10.0.0.1": 1, "10.0.0.2": 0}}
    assert records.idle_workers(drained, workers) == ["i-2", "i-3"]  # i-3: Ray lists it no more
    assert records.idle_workers({"counts": {"queued": 1}, "nodes": {}}, workers) == []


def test_cost_shares_add_up_to_the_cost_by_seconds_run():
    elements = [{"seconds": 1.0}, {"seconds": 3.0}]
    assert records.cost_shares(elements, 0.4) == [0.1, 0.3]
    assert records.cost_shares(elements, None) == [None, None]
    assert records.cost_shares([{"seconds": 0}, {}], 0.2) == [0.1, 0.1]
    record = {"cost_usd": 0.4, "pool": {"elements": [dict(e) for e in elements]}}
    assert [e["cost_usd"] for e in records.with_cost_shares(record)["pool"]["elements"]] == [0.1, 0.3]
    assert records.with_cost_shares({"cost_usd": 1}) == {"cost_usd": 1}


def _args(role, **over):
    base = {"role": role, "ip": "127.0.0.7", "gpus": 4, "cpus": 8, "address": "127.0.0.2:6379",
            "object_store_bytes": 0, "temp_dir": "/tmp/ec2gpu-ray-a1b2c3"}
    return argparse.Namespace(**{**base, **over})


def test_a_node_command_line():
    ports = node.ports_for("127.0.0.7", 8)
    head = node.argv(_args("head"), 6380, ports)
    assert "--head" in head and "--port=6380" in head and "--include-dashboard=false" in head
    assert "--num-gpus=4" in head and "--block" in head and "--temp-dir=/tmp/ec2gpu-ray-a1b2c3/ray" in head
    assert not any(a.startswith("--address") for a in head)
    worker = node.argv(_args("worker"), None, ports)
    assert "--address=127.0.0.2:6379" in worker and "--head" not in worker
    flags = dict(a.split("=", 1) for a in worker if a.startswith("--") and "=" in a)
    assert [int(flags[f]) for f in node.PORT_FLAGS] == ports[:len(node.PORT_FLAGS)]
    assert flags["--worker-port-list"].split(",") == [str(p) for p in ports[len(node.PORT_FLAGS):]]


@pytest.mark.parametrize("flags, head_up, ends", [(["--end-instance"], False, True), (["--end-instance"], True, False),
                                                   ([], False, False)])
def test_a_worker_whose_ray_ends_by_itself_ends_its_instance_when_its_head_is_gone(monkeypatch, tmp_path, flags,
                                                                                   head_up, ends):
    """The head gone (its raylet leaves when the GCS is silent): a run's worker ends its instance
    (node.py --end-instance); not while the head answers (its own Ray died: the controller sees to
    it), nor one that outlives the run (--keep)."""
    import sys as _sys
    ended = []
    monkeypatch.setattr(node, "argv", lambda args, port, ports: [_sys.executable, "-c", "raise SystemExit(1)"])
    monkeypatch.setattr(node, "_ready", lambda proc, targets: True)
    monkeypatch.setattr(node, "head_answers", lambda address: head_up)
    monkeypatch.setattr(node, "end_instance", lambda: ended.append(True))
    (tmp_path / "token").touch(mode=0o600)
    code = node.main(["worker", "--ip", "127.0.0.9", "--gpus", "1", "--cpus", "1", "--address", "127.0.0.2:6379",
                      "--ready-file", str(tmp_path / "ready"), "--token-file", str(tmp_path / "token"), *flags])
    assert code == 1 and ended == ([True] if ends else [])


def test_a_head_answers_while_its_gcs_port_accepts_connections():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        assert node.head_answers(address, tries=1)
    assert not node.head_answers(address, tries=1, timeout_s=0.5)


def test_a_node_that_ends_itself_writes_its_mount_mode_file_mounts_back_first(monkeypatch, tmp_path):
    (tmp_path / "ray").mkdir()
    (tmp_path / "s3mounts.json").write_text("{}")
    (tmp_path / "s3files.py").write_text("import sys, pathlib; pathlib.Path(sys.argv[0]).with_name('wrote').write_text("
                                         "' '.join(sys.argv[1:2]))")
    (tmp_path / "agent.py").write_text("import pathlib\ndef end_instance():\n    pathlib.Path(__file__)"
                                       ".with_name('ended').write_text('yes')\n")
    monkeypatch.setattr(node, "__file__", str(tmp_path / "ray" / "node.py"))
    assert node.main(["end"]) == 0
    assert (tmp_path / "wrote").read_text() == "out" and (tmp_path / "ended").read_text() == "yes"


def test_the_driver_lets_idle_workers_go_once_its_controller_is_silent_and_nothing_waits(tmp_path):
    beat = tmp_path / "controller"
    assert driver.controller_silent(str(beat), 5, since=1000.0, now=1006.0)  # never heard: counted from the start
    assert not driver.controller_silent(str(beat), 5, since=1000.0, now=1004.0)
    beat.write_text("")
    os.utime(beat, (2000.0, 2000.0))
    assert not driver.controller_silent(str(beat), 5, since=1000.0, now=2003.0)  # heard 3 s ago
    assert driver.controller_silent(str(beat), 5, since=1000.0, now=2005.0)
    nodes = [{"NodeID": "h", "NodeManagerAddress": "10.0.0.1", "Alive": True},
             {"NodeID": "a", "NodeManagerAddress": "10.0.0.2", "Alive": True},
             {"NodeID": "b", "NodeManagerAddress": "10.0.0.3", "Alive": True},
             {"NodeID": "c", "NodeManagerAddress": "10.0.0.4", "Alive": False},
             {"NodeID": "d", "NodeManagerAddress": "10.0.0.5", "Alive": True}]
    busy = {"10.0.0.1": 0, "10.0.0.2": 1, "10.0.0.3": 0, "10.0.0.5": 0}
    assert driver.to_release(2, nodes, busy, "h", {}) == []  # elements wait: every node may take one
    got = driver.to_release(0, nodes, busy, "h", {"d": "10.0.0.5"})
    assert [n["NodeID"] for n in got] == ["b"]  # not the head, a busy one, a dead one, or one let go already


def test_the_nodes_of_one_machine_take_ports_of_their_own():
    a, b = node.ports_for("127.0.0.2", 4), node.ports_for("127.0.0.3", 4)
    assert not set(a) & set(b) and len(a) == len(set(a)) == len(node.PORT_FLAGS) + node.worker_ports(4)
    assert all(node.PORT_BASE <= p < 32768 for p in a + b)  # below Linux's ephemeral ports
    assert node.ports_for("10.1.2.3", 4) == node.ports_for("10.9.2.3", 4)  # one machine per address on EC2


def test_the_largest_catalog_type_gets_a_worker_port_for_each_of_its_cpus_and_more():
    """--num-cpus is the type's vCPUs (192 on p5.48xlarge): Ray starts that many workers, each on a
    port of --worker-port-list, and with fewer ports they fail "No available ports" (ray#28071)."""
    largest = max(catalog.CATALOG.values(), key=lambda t: t.vcpus)
    args = _args("worker", cpus=largest.vcpus)
    addresses = [f"10.0.{n // 256}.{n % 256}" for n in range(0, 65536, 97)]
    for ip in addresses[:50]:
        ports = node.ports_for(ip, largest.vcpus)
        flags = dict(a.split("=", 1) for a in node.argv(args, None, ports) if a.startswith("--") and "=" in a)
        workers = flags["--worker-port-list"].split(",")
        assert len(workers) == len(set(workers)) >= 2 * largest.vcpus + node.WORKER_PORTS
        assert flags["--num-cpus"] == str(largest.vcpus)
        assert all(node.PORT_BASE <= p < 32768 for p in ports) and len(set(ports)) == len(ports)
    first, second = node.ports_for("127.0.0.2", largest.vcpus), node.ports_for("127.0.0.3", largest.vcpus)
    assert not set(first) & set(second)  # two large nodes of one machine still take ports of their own


def test_the_head_takes_rays_default_port_unless_it_is_taken():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert node.gcs_port(taken) != taken
    free = node.free_ports(3)
    assert len(set(free)) == 3


def test_a_nodes_ray_ends_at_once_on_sigterm():
    assert node.HEALTH_CHECKS["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"


def test_the_driver_packs_regular_files_within_its_bound(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "a.txt").write_text("a" * 10)
    (tmp_path / "d" / "b.txt").write_text("b" * 10)
    (tmp_path / "big").write_text("c" * 100)
    os.symlink("/etc/passwd", tmp_path / "link")
    tar, left = driver._pack(str(tmp_path), 25)
    names = tarfile.open(fileobj=io.BytesIO(tar)).getnames()
    assert sorted(names) == ["a.txt", "d/b.txt"] and "2 file(s) left out" in left


def test_the_driver_unpacks_nothing_outside_its_target(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        driver._unpack(buf.getvalue(), str(tmp_path / "out"), 1 << 20)
    assert not (tmp_path / "escape.txt").exists()


def test_gpus_per_job():
    opts = type("O", (), {"gpus_per_job": None})()
    assert attempt.gpus_per_job(opts, 4) == 4 and attempt.gpus_per_job(opts, 0) == 1
    opts.gpus_per_job = 2
    assert attempt.gpus_per_job(opts, 4) == 2
    opts.gpus_per_job = 8
    with pytest.raises(UsageError, match="4 GPU"):
        attempt.gpus_per_job(opts, 4)


@pytest.mark.parametrize("kwargs, says", [
    ({"array": "5-1"}, "runs backwards"), ({"workers": 3}, "--workers is for an array"),
    ({"array": 4, "nodes": 2}, "--nodes runs one job"),
    ({"array": 4, "workers": 65}, "1 to 64"), ({"array": 4, "max_retries": 11}, "0 to 10"),
    ({"array": 4, "gpus_per_job": 0}, "1 to 64"),
])
def test_run_refuses_a_bad_array_before_anything_starts(no_backend, tmp_path, monkeypatch, kwargs, says):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=says):
        api.run(command=["true"], **kwargs)


@pytest.mark.parametrize("kwargs, says", [
    ({"sweep": {"lrate": [1]}}, "not a flag of the built-in trainer"), ({"sweep": {"lr": [1]}, "local": True},
                                                                          "pool of new instances"),
    ({"sweep": {"model": ["resnet"]}}, "unknown model"), ({"workers": 2}, "--workers is for a sweep"),
    ({"sweep": {"lr": []}}, "list of values"),
])
def test_train_mnist_refuses_a_bad_sweep_before_anything_starts(no_backend, kwargs, says):
    with pytest.raises(UsageError, match=says):
        api.train_mnist(**kwargs)


def test_the_sweep_flag_grammar():
    from ec2gpu.cli.train import sweep_flags
    assert sweep_flags(["lr=0.1,0.05", "seed=0,1,2"]) == {"lr": ["0.1", "0.05"], "seed": ["0", "1", "2"]}
    for bad in (["lr"], ["lr="], ["=1"], ["lr=1", "lr=2"]):
        with pytest.raises(UsageError):
            sweep_flags(bad)


def test_a_dry_run_shows_the_array(no_aws, monkeypatch, capsys):
    monkeypatch.chdir(no_aws)
    (no_aws / "t.yaml").write_text("workdir: .\nrun: echo hi\narray: 12\nmax_workers: 3\nresources:\n"
                                   "  instance_type: g4dn.xlarge\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--sandbox"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["array"]["elements"] == 12 and plan["array"]["workers"] == 3 and plan["nodes"] == 3
    assert plan["array"]["first"][0] == {"EC2GPU_ARRAY_INDEX": "0", "EC2GPU_ARRAY_SIZE": "12"}
    assert cli.main(["run", "t.yaml", "--dry-run", "--sandbox", "--array", "3,7"]) == 0
    assert "array: 2 of 12 elements (3, 7) over at most 2 instances" in capsys.readouterr().out


def test_the_eta_comes_from_the_finished_elements():
    st = {"counts": {"queued": 4, "running": 2}, "elements": [
        {"status": "succeeded", "seconds": 10.0}, {"status": "failed", "seconds": 20.0}, {"status": "running",
                                                                                        "seconds": None}]}
    assert follow.eta_s(st, 2) == 15.0 * 5 / 2
    assert follow.eta_s({"counts": {}, "elements": []}, 2) is None


def test_an_elements_log_comes_from_the_finished_runs_artifacts(tmp_path):
    from ec2gpu.runs.execute import logs
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "3.log").write_text("element 3\n")
    (tmp_path / "pool.json").write_text(json.dumps({"elements": [{"index": 3, "exit_status": 7}]}))
    row = {"run_id": "r1", "artifacts": str(tmp_path)}
    path, status = logs.element_log(tmp_path, row, "r1", 3)
    assert path.read_text() == "element 3\n" and status == 7
    with pytest.raises(UsageError, match="no log of element 4"):
        logs.element_log(tmp_path, row, "r1", 4)
    with pytest.raises(UsageError, match="not known here"):
        logs.element_log(tmp_path, None, "r1", 3)
    with pytest.raises(UsageError, match="0 to 9,999"):
        logs.element_log(tmp_path, row, "r1", -1)


def test_while_the_array_runs_an_ended_elements_log_is_read_from_what_came_home(tmp_path, monkeypatch):
    """`logs RUN --index K` during the run: the elements that ended have their logs here (brought
    home every 10 s); one still running is said so, with where to look."""
    from ec2gpu.runs.execute import logs
    from ec2gpu.runs.settle import ledger, record
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    art = tmp_path / "runs" / "20261127-120000-aaaa"
    (art / "logs").mkdir(parents=True)
    (art / "logs" / "3.log").write_text("element 3\n")
    ledger.record(tmp_path / "home", record.new("20261127-120000-aaaa", "ec2gpu run --array 8", "sandbox", art,
                                                task="t"))
    assert logs.finished(tmp_path / "home", "20261127-120000-aaaa") is None  # still running
    path, status = logs.element_log(tmp_path / "home", None, "20261127-120000-aaaa", 3)
    assert path.read_text() == "element 3\n" and status is None
    with pytest.raises(logs.NotEnded) as running:  # read from its worker instead (stream_element)
        logs.element_log(tmp_path / "home", None, "20261127-120000-aaaa", 5)
    assert running.value.row["run_id"] == "20261127-120000-aaaa"


def test_the_node_running_an_element_is_read_from_the_heads_record_as_hostile_input():
    from ec2gpu.runs.execute.logs import running_element
    record = json.dumps({"elements": [
        {"index": 1, "status": "running", "nodes": ["127.0.0.4", "127.0.0.5"]},
        {"index": 2, "status": "succeeded", "exit_status": 3, "nodes": ["127.0.0.4"]},
        {"index": 3, "status": "running", "nodes": ["127.0.0.4; rm -rf /"]},
        {"index": 4, "status": "queued", "nodes": []}]}).encode()
    assert running_element(record, 1) == ("127.0.0.5", None)  # its latest attempt's node
    assert running_element(record, 2) == (None, 3)  # ended: its exit status
    assert running_element(record, 3) == (None, None)  # not an address: never used
    assert running_element(record, 4) == (None, None)
    assert running_element(b"not json", 1) == (None, None) and running_element(None, 1) == (None, None)


class _Job:
    """A stand-in TaskJob: its secret values (masked with job_summary.mask_text)."""

    secret_values = ["hunter2"]


def test_a_secret_an_element_printed_is_masked_in_its_log_and_its_last_lines(tmp_path, monkeypatch):
    (tmp_path / "0.log").write_text("token hunter2\nok\n")
    attempt._mask_logs(tmp_path, _Job())
    assert (tmp_path / "0.log").read_text() == "token ****\nok\n"

    class Head:
        run_dir = "/r"
        conn = None

    class Opts:
        elements = arrays.elements(None, {"lr": [0.1, 0.2]})
        task = _Job()

    raw = status(elements=[{"index": 0, "status": "failed", "tail": ["key hunter2"], "error": "hunter2!"}])
    from ec2gpu.remote import jobs
    monkeypatch.setattr(jobs, "read_from", lambda *a, **k: raw)
    got = follow.read_status(Head(), Opts(), type("UI", (), {"notes": [], "note": lambda self, t: None})())
    assert got["elements"][0]["tail"] == ["key ****"] and got["elements"][0]["error"] == "****!"


def test_the_tasks_outputs_globs_apply_inside_each_elements_directory():
    assert attempt.element_patterns(["*.json", "results/*.pt", "/model.pt", "!logs/", "!tmp/x"]) == [
        "*.json", "/*/results/*.pt", "/*/model.pt", "!logs/", "!/*/tmp/x"]


def test_the_pool_is_as_large_as_its_elements_need_and_a_gpu_count_is_checked_before_launch():
    from ec2gpu.runs.plan.runplan import pool_size as _pool_size
    from ec2gpu.tasks.spec import Task
    task = Task(run="x", array=4, max_workers=4)
    assert attempt.slots_per_node(["g5.12xlarge"], 1) == 4 and attempt.slots_per_node(["g5.12xlarge"], None) == 1
    assert _pool_size(task, arrays.elements(4), None, 4) == 1 and _pool_size(task, arrays.elements(4), 2, 1) == 2
    assert _pool_size(task, arrays.elements(9), None, 4) == 3
    with pytest.raises(UsageError, match="g4dn.xlarge has 1 GPU"):
        attempt.slots_per_node(["g5.12xlarge", "g4dn.xlarge"], 2)


def test_the_driver_refuses_a_link_in_an_elements_outputs(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("x")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    with pytest.raises(tarfile.TarError, match="refused"):
        driver._unpack(buf.getvalue(), str(tmp_path / "out"), 1 << 20)
    assert not (tmp_path / "out" / "x").exists()


def test_an_array_refuses_ports_and_several_nodes_before_anything_starts(no_backend, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.yaml").write_text("workdir: null\nrun: x\narray: 3\nports: [6006]\n")
    with pytest.raises(UsageError, match="does not take ports"):
        api.run(str(tmp_path / "t.yaml"))
    (tmp_path / "u.yaml").write_text("workdir: null\nrun: x\nnodes: 2\n")
    with pytest.raises(UsageError, match="--nodes runs one job"):
        api.run(str(tmp_path / "u.yaml"), array=3)


def _array_run(run_id, seconds, status="completed", itype="g4dn.xlarge", task="arr"):
    """A ledger row of a past array of ``task``, its succeeded elements' times (``seconds``)."""
    elements = [{"index": k, "status": "succeeded", "seconds": s} for k, s in enumerate(seconds)]
    return {"run_id": run_id, "command": "run", "backend": "sandbox", "status": status, "task": task,
            "started_at": "2026-11-20T10:00:00+00:00", "instance_type": itype,
            "phases": {"running": 999.0}, "element_seconds": records.element_seconds(elements)}


def test_an_elements_time_comes_from_the_past_arrays_of_the_task_weighted_by_their_elements(tmp_path):
    from types import SimpleNamespace
    from ec2gpu.runs.plan import costs
    from ec2gpu.runs.settle import ledger

    job = SimpleNamespace(name="arr", history_key="arr")
    assert records.element_seconds([{"status": "failed", "seconds": 9.0}, {"status": "succeeded", "seconds": 0}]) is None
    assert costs.element_minutes(tmp_path, job, "g4dn.xlarge", None, "sandbox") == (
        None, "no element of task arr has run on g4dn.xlarge before")
    assert costs.element_minutes(tmp_path, job, "g4dn.xlarge", 2.0, "sandbox") == (2.0, "--expect (an element's)")
    ledger.record(tmp_path, _array_run("a", [60.0, 120.0, 90.0]))  # 3 elements, mean 90 s
    ledger.record(tmp_path, _array_run("b", [180.0]))  # 1 element
    for other in (_array_run("c", [6000.0], status="failed"), _array_run("d", [6000.0], itype="g5.xlarge"),
                  _array_run("e", [6000.0], task="other")):
        ledger.record(tmp_path, other)
    ledger.record(tmp_path, {**_array_run("f", [1.0]), "element_seconds": {"count": True, "mean_seconds": "x"}})
    assert costs.element_minutes(tmp_path, job, "g4dn.xlarge", 99.0, "sandbox") == (
        (3 * 90.0 + 180.0) / 4 / 60, "mean of 4 elements of 2 past arrays of task arr on g4dn.xlarge (ledger)")
    # the whole array's running time is no single job's: the task's next plain run is not estimated from it
    assert costs.estimate_minutes(tmp_path, job, "g4dn.xlarge", None, "sandbox")[0] is None


@pytest.mark.parametrize("elements, instances, slots, rounds", [(12, 3, 1, 4), (13, 3, 1, 5), (100, 3, 4, 9),
                                                                (2, 3, 1, 1), (0, 3, 1, 1)])
def test_a_pool_runs_its_elements_in_rounds(elements, instances, slots, rounds):
    from ec2gpu.runs.plan import costs
    assert costs.pool_rounds(elements, instances, slots) == rounds


def test_an_arrays_estimate_is_an_elements_time_from_history_times_its_rounds(no_aws, capsys):
    from ec2gpu.runs.settle import ledger

    (no_aws / "t.yaml").write_text("name: arr\nworkdir: .\nrun: echo hi\narray: 12\nmax_workers: 3\nresources:\n"
                                   "  instance_type: g4dn.xlarge\n")
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--sandbox", "--expect", "2m"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimate"]
    assert estimate["job_minutes"] == 8.0 and "--expect (an element's); x 4 rounds" in estimate["source"]
    ledger.record(no_aws / "home", _array_run("a", [30.0, 90.0]))  # an element: 1 min
    assert cli.main(["run", "t.yaml", "--dry-run", "--json", "--sandbox", "--expect", "2m", "--workers", "2"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimate"]
    assert estimate["job_minutes"] == 6.0, estimate  # 12 elements over 2 instances: 6 rounds of 1 min
    assert estimate["source"].startswith("mean of 2 elements of 1 past array of task arr"), estimate
    # the run's own estimate (pipeline.check_estimate) says the same, and a --budget below it is refused
    from types import SimpleNamespace
    from ec2gpu import settings as settings_mod
    from ec2gpu.runs.execute.reporter import Reporter
    from ec2gpu.runs.options import PoolOptions
    from ec2gpu.runs.provision import pipeline

    job = SimpleNamespace(name="arr", history_key="arr", builtin=None)
    opts = PoolOptions(instance_type="g4dn.xlarge", spot=False, nodes=2, task=job,
                       elements=tuple(arrays.elements(12, None, None)), max_runtime_minutes=60)
    ui = Reporter()
    aws = SimpleNamespace(region="us-east-1")  # on-demand: the price table, no AWS call
    est = pipeline.check_estimate(aws, settings_mod.load({}), opts, "sandbox", ui)
    assert est.train_seconds == 360.0 and "x 6 rounds: 12 elements over 2 instances" in est.time_source
    assert any("elements 360 s" in line for line in ui.notes), ui.notes
    with pytest.raises(UsageError, match="above --budget"):
        pipeline.check_estimate(aws, settings_mod.load({}), replace(opts, budget_usd=est.cost_usd / 2), "sandbox", ui)


def _node(k, iid, launched_epoch):
    from datetime import datetime, timezone
    from types import SimpleNamespace
    from ec2gpu.runs.execute.nodes import Node
    return Node(k, SimpleNamespace(id=iid, launched_at=datetime.fromtimestamp(launched_epoch, timezone.utc)))


def test_the_cost_so_far_bills_each_instance_from_launch_until_it_left_with_the_minute_minimum():
    t0 = 1.8e9
    pool = follow.Pool([_node(0, "i-h", t0), _node(1, "i-w", t0), _node(2, "i-x", t0 + 3590)])
    pool.left_at["i-w"] = t0 + 1800  # released after half an hour
    pool.usd_per_hour = {"i-h": 1.0, "i-w": 2.0, "i-x": 0.36}
    # head: 1 h at $1; the worker it let go: 0.5 h at $2; the last: 10 s, billed 60 s at $0.36
    assert pool.cost_so_far(t0 + 3600) == round(1.0 + 1.0 + 0.006, 4)
    pool.usd_per_hour["i-x"] = None
    assert pool.cost_so_far(t0 + 3600) is None  # not a partial figure shown as the whole


def test_status_of_an_array_reads_its_live_line_then_its_final_counts(tmp_path, capsys, monkeypatch):
    from ec2gpu.runs.settle import ledger

    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    row = {"run_id": "r-arr", "command": "run", "backend": "sandbox", "status": "running", "task": "arr",
           "started_at": "2026-11-27T10:00:00+00:00", "artifacts": str(out),
           "controller": {"host": "here", "pid": 1, "started": 0}}  # a run in the foreground records its controller
    ledger.record(tmp_path / "home", row)
    assert attempt.local_status(tmp_path / "home", "r-arr") is None  # nothing written yet: not known as an array
    assert attempt.local_status(tmp_path / "home", "r-none") is None
    ledger.record(tmp_path / "home", {**row, "run_id": "r-det", "status": "detached", "controller": None,
                                      "artifacts": str(tmp_path / "det")})
    (tmp_path / "det").mkdir()
    (tmp_path / "det" / "pool.json").write_text("{}")
    assert attempt.local_status(tmp_path / "home", "r-det") is None  # a detached run's status is in S3
    out.mkdir()
    follow.write_progress(out / follow.PROGRESS_FILE, follow._progress(
        follow.Pool([]), json.loads(status(counts={"done": 5, "failed": 1, "running": 3, "queued": 3})), 12))
    got = api.status("r-arr")
    assert got.state == "running" and got.array["counts"] == {"done": 5, "failed": 1, "running": 3, "queued": 3}
    assert got.array["instances"] == 0 and got.array["cost_so_far_usd"] == 0.0
    assert cli.main(["status", "r-arr"]) == 0
    said = capsys.readouterr().out
    assert "run r-arr: running (an array of task arr)" in said and "5 done, 3 running, 3 queued, 1 failed" in said
    assert "$0.0000 so far" in said
    # hostile or broken figures read as absent, never as an error
    (out / follow.PROGRESS_FILE).write_text('{"instances": "3", "eta_s": Infinity, "cost_so_far_usd": -1, '
                                             '"counts": {"done": "x", "failed": -2, "queued": NaN}, "at": 1e30}')
    got = api.status("r-arr")
    assert got.array["counts"] == {} and got.array["instances"] is None and got.array["updated_at"] is None
    assert got.array["eta_s"] is None and got.array["cost_so_far_usd"] is None
    assert cli.main(["status", "r-arr"]) == 0 and "0 done, 0 running" in capsys.readouterr().out
    # over: the driver's final counts and the run's cost
    (out / "pool.json").write_text(json.dumps({"counts": {"done": 12, "failed": 0, "running": 0, "queued": 0}}))
    ledger.record(tmp_path / "home", {**row, "status": "completed", "cost_usd": 0.0123})
    assert cli.main(["status", "r-arr", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["state"] == "completed" and got["array"]["counts"]["done"] == 12 and got["cost_usd"] == 0.0123


def test_an_array_whose_controller_is_gone_says_so_and_shows_what_its_head_handed_over(tmp_path, capsys,
                                                                                        monkeypatch):
    import contextlib
    import socket as _socket
    from types import SimpleNamespace
    from ec2gpu import backend
    from ec2gpu.runs.recover import handover
    from ec2gpu.runs.settle import ledger
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    out.mkdir()
    follow.write_progress(out / follow.PROGRESS_FILE, {"instances": 2, "total": 4, "at": 1.8e9, "eta_s": 30,
                                                           "counts": {"done": 0, "running": 2, "queued": 2}})
    ledger.record(tmp_path / "home", {  # its controller, on this host, exited: a pid no process has
        "run_id": "r-lost", "command": "run", "backend": "sandbox", "status": "running", "task": "arr",
        "started_at": "2026-11-27T10:00:00+00:00", "artifacts": str(out),
        "controller": {"host": _socket.gethostname(), "pid": 2 ** 22 + 7, "started": 0}})
    got = attempt.local_status(tmp_path / "home", "r-lost")
    assert got["state"] == "controller-lost" and got["array"]["instances"] is None and got["array"]["eta_s"] is None
    handed = {"state": "succeeded", "handover": "uploaded", "handover_at": "2026-11-27T10:05:00+00:00",
              "array": {"done": 4, "failed": 0, "running": 0, "queued": 0}}
    monkeypatch.setattr(backend, "Context", lambda *a, **k: contextlib.nullcontext(SimpleNamespace(aws=None)))
    monkeypatch.setattr(handover, "handed", lambda aws, run_id: handed)
    got = api.status("r-lost")
    assert got.array["counts"]["done"] == 4 and got.array["final"] and got.handover["state"] == "succeeded"
    assert cli.main(["status", "r-lost", "--sandbox"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "4 done" in said and "handed the results over to S3" in said and "`ec2gpu fetch r-lost --sandbox`" in said
    monkeypatch.setattr(handover, "handed", lambda aws, run_id: None)  # not yet
    assert cli.main(["status", "r-lost"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "2 running, 2 queued" in said and "its controller was lost then" in said


def test_a_lost_worker_is_replaced_one_at_a_time_while_elements_wait_and_the_pool_is_below_its_size(monkeypatch):
    import threading
    from types import SimpleNamespace
    from ec2gpu.aws import instances
    from ec2gpu.pool import grow
    from ec2gpu.runs.execute.reporter import Reporter

    started, ended, gates = [], [], []

    def start(ctx, lost, zone, index, addresses, ui):  # a replacement being made until its gate opens
        started.append((lost, zone, index, list(addresses)))
        gates.append(threading.Event())
        rep = grow.Replacement(lost, index, thread=threading.Thread(target=gates[-1].wait))
        rep.thread.start()
        return rep

    monkeypatch.setattr(grow, "start", start)
    monkeypatch.setattr(follow, "prices_of", lambda aws, settings, nodes: {nd.instance_id: 0.5 for nd in nodes})
    monkeypatch.setattr(instances, "terminate", lambda ec2, ids, wait=True: ended.extend(ids))
    nodes = [_node(k, f"i-{k}", 1.8e9) for k in range(3)]
    for k, nd in enumerate(nodes):
        nd.instance.zone = f"us-east-1{'abc'[k]}"
    pool = follow.Pool(nodes, members={nd.instance_id: nd for nd in nodes})
    ctx = SimpleNamespace(opts=SimpleNamespace(nodes=3), settings=None)
    addresses, ui, aws = {0: "10.0.0.0", 1: "10.0.0.1", 2: "10.0.0.2"}, Reporter(), SimpleNamespace(ec2=None)
    waiting = {"counts": {"queued": 4}}
    follow._grow(aws, pool, waiting, ctx, addresses, ui)
    assert started == []  # nothing lost yet: the pool is at its size
    pool.members.pop("i-2")
    pool.lost.append("i-2")
    follow._grow(aws, pool, {"counts": {"queued": 0}}, ctx, addresses, ui)
    assert started == []  # nothing waits: the pool is shrinking, not growing
    follow._grow(aws, pool, waiting, None, addresses, ui)
    assert started == []  # no way to launch one (a caller without a grow context)
    follow._grow(aws, pool, waiting, ctx, addresses, ui)
    assert started == [("i-2", "us-east-1c", 3, ["10.0.0.0", "10.0.0.1", "10.0.0.2"])]
    follow._grow(aws, pool, waiting, ctx, addresses, ui)
    assert len(started) == 1  # one at a time
    # it joined: a member like the others, at the next index and address
    rep = pool.growing
    rep.node, rep.address, rep.instance_id = _node(3, "i-3", 1.8e9), "10.0.0.3", "i-3"
    gates[-1].set()
    rep.thread.join()
    follow._grow(aws, pool, waiting, ctx, addresses, ui)
    assert pool.growing is None and "i-3" in pool.members and pool.nodes[3].instance_id == "i-3"
    assert addresses[3] == "10.0.0.3" and pool.usd_per_hour["i-3"] == 0.5
    assert pool.replacements == [{"for": "i-2", "instance_id": "i-3", "node": 3, "joined": True, "error": None}]
    assert len(started) == 1  # i-2 has had its replacement; the pool is at its size anyway
    # a replacement that failed: its instance ends, and the pool goes on without it
    pool.lost.append("i-1")
    pool.members.pop("i-1")
    follow._grow(aws, pool, waiting, ctx, addresses, ui)
    assert started[-1][0] == "i-1" and started[-1][2] == 4
    rep = pool.growing
    rep.instance_id, rep.error = "i-9", "WaitTimeout: no SSH"
    gates[-1].set()
    rep.thread.join()
    follow._grow(aws, pool, {"counts": {"queued": 0}}, ctx, addresses, ui)
    assert ended == ["i-9"] and pool.replacements[-1]["joined"] is False and "i-9" not in pool.members
    assert any("no replacement for i-1 (WaitTimeout: no SSH)" in n for n in ui.notes)
    # one being made when nothing waits any more is stopped (its instance is ended by its thread)
    pool.lost.append("i-0x")
    follow._grow(aws, pool, waiting, ctx, addresses, ui)
    assert started[-1][0] == "i-0x" and not pool.growing.stop.is_set()
    assert started[-1][2] == 5  # not 4 again: the failed one's instance was tagged node 4
    follow._grow(aws, pool, {"counts": {"queued": 0}}, ctx, addresses, ui)
    assert pool.growing.stop.is_set() and any("the replacement for i-0x stops" in n for n in ui.notes)
    gates[-1].set()
    pool.growing.thread.join()


def test_a_pool_that_started_small_grows_while_more_elements_wait_than_it_has_free_slots(monkeypatch):
    """Issue 31, item 3: EC2 launched 1 of the 2 instances asked for; the pool grows by one while
    elements wait that no free slot takes, and a launch that failed is asked again GROW_RETRY_S later."""
    import threading
    from types import SimpleNamespace
    from ec2gpu.aws import instances
    from ec2gpu.pool import grow
    from ec2gpu.runs.execute.reporter import Reporter

    started = []

    def start(ctx, lost, zone, index, addresses, ui):  # a launch that fails at once (no capacity anywhere)
        started.append((lost, zone, index))
        rep = grow.Replacement(lost, index, error="CapacityError: no g4dn.xlarge anywhere",
                               thread=threading.Thread(target=lambda: None))
        rep.thread.start()
        rep.thread.join()
        return rep

    monkeypatch.setattr(grow, "start", start)
    monkeypatch.setattr(instances, "terminate", lambda ec2, ids, wait=True: None)
    nodes = [_node(0, "i-0", 1.8e9)]
    pool = follow.Pool(nodes, members={"i-0": nodes[0]}, slots_per_node=2)
    ctx = SimpleNamespace(opts=SimpleNamespace(nodes=2), settings=None)
    addresses, ui, aws = {0: "10.0.0.0"}, Reporter(), SimpleNamespace(ec2=None)
    follow._grow(aws, pool, {"counts": {"queued": 1, "running": 1}}, ctx, addresses, ui)
    assert started == []  # the one waiting has a free slot (Ray has not placed it yet)
    follow._grow(aws, pool, {"counts": {"queued": 3, "running": 2}}, ctx, addresses, ui)
    assert started == [(None, None, 1)] and "launching one more" in ui.notes[-1]
    follow._grow(aws, pool, {"counts": {"queued": 3, "running": 2}}, ctx, addresses, ui)  # it failed
    assert pool.growing is None and pool.replacements[-1]["for"] is None
    assert "no instance the pool grows by (CapacityError" in ui.notes[-1] and "asked again in 60 s" in ui.notes[-1]
    follow._grow(aws, pool, {"counts": {"queued": 3, "running": 2}}, ctx, addresses, ui)
    assert len(started) == 1  # not asked again at once
    pool.grow_after = 0.0  # a minute later
    follow._grow(aws, pool, {"counts": {"queued": 3, "running": 2}}, ctx, addresses, ui)
    assert started[-1] == (None, None, 2)  # the next number: the failed launch's is never reused


def test_the_pool_follows_its_head_through_a_dropped_connection_and_counts_it_lost_after_the_bound(monkeypatch):
    from types import SimpleNamespace
    from ec2gpu.runs.execute.reporter import Reporter
    from ec2gpu.runs.recover import recovery

    clock = [0.0]
    monkeypatch.setattr(follow.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(follow.time, "monotonic", lambda: clock[0])
    outcomes = [OSError("reset"), EOFError(), (False, {"counts": {}}), (True, {"final": True})]

    def poll(*a, **k):
        got = outcomes.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got

    monkeypatch.setattr(follow, "_poll", poll)
    connects = []
    head = SimpleNamespace(instance_id="i-h", watch=None, close=lambda: None, conn=None,
                           connect=lambda: connects.append(1) or "conn")
    opts = SimpleNamespace(unreachable_s=120.0, task=SimpleNamespace(secret_values=[]), elements=())
    ui = Reporter()
    assert follow._follow_loop(None, None, head, opts, [], ui, None, None, None) == {"final": True}
    assert len(connects) == 2 and head.conn == "conn"
    assert any("did not answer (OSError); reconnecting" in n for n in ui.notes)
    assert any("answers again" in n for n in ui.notes)
    # unreachable longer than the bound: the head counts as lost, the run's next attempt goes on
    outcomes[:] = [OSError("down")] * 100
    with pytest.raises(recovery.Interrupted, match="unreachable over SSH"):
        follow._follow_loop(None, None, head, opts, [], ui, None, None, None)
    assert clock[0] > 120
    # EC2 says the head is gone: lost at once, without waiting for the bound
    outcomes[:] = [OSError("down")] * 100
    start = clock[0]

    def gone():
        raise recovery.Interrupted("EC2 reports the instance terminated")
    head.watch = SimpleNamespace(check=gone)
    with pytest.raises(recovery.Interrupted, match="terminated"):
        follow._follow_loop(None, None, head, opts, [], ui, None, None, None)
    assert clock[0] - start < 1


def _gone(pid: int, within_s: float) -> bool:
    import time
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_an_elements_processes_end_with_the_ray_worker_that_ran_it_even_when_it_is_killed(tmp_path):
    """The keeper (driver.REAPER) between a Ray worker and an element: the worker killed with
    SIGKILL (Ray's memory monitor does that), the element's whole group ends too."""
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    element = ["sh", "-c", f"sleep 300 & echo $! > {pids}; sleep 300"]
    worker = subprocess.Popen([sys.executable, "-c", "import sys, subprocess\n"
                               "from ec2gpu.pool import driver\n"
                               "with open(sys.argv[1], 'wb') as log:\n"
                               "    driver.keep(sys.argv[2:], '.', None, log)\n", str(tmp_path / "log"), *element],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        background = int(pids.read_text())
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert _gone(background, driver.REAPER_GRACE_S + 5), "the element outlived its worker"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_an_element_keeps_its_exit_status_and_leaves_nothing_running(tmp_path):
    (tmp_path / "signal.py").write_text("raise SystemExit(99)\n")  # a workdir's module never shadows the keeper's
    with open(tmp_path / "log", "wb") as log:
        assert driver.keep(["sh", "-c", "echo hi; exit 3"], str(tmp_path), dict(os.environ), log) == 3
        assert driver.keep(["sh", "-c", f"sleep 300 & echo $! > {tmp_path}/bg; kill -TERM $$"], str(tmp_path),
                           dict(os.environ), log) == 128 + 15
    assert (tmp_path / "log").read_text().startswith("hi")
    assert _gone(int((tmp_path / "bg").read_text()), 5)  # a process it left behind ended with it


def test_a_replacement_numbered_past_a_failed_one_gets_its_own_address_in_its_environment(monkeypatch, tmp_path):
    """Node 3's replacement failed before it had an address; node 4 is made next: its place in
    SKYPILOT_NODE_IPS is the list's last, not its index (addresses[4] of a list of 4 raised IndexError)."""
    from types import SimpleNamespace
    from ec2gpu.aws import instances
    from ec2gpu.pool import grow
    from ec2gpu.remote import ssh_config as sc
    from ec2gpu.runs.execute import engine, nodes as N
    from ec2gpu.runs.provision import resources
    from ec2gpu.runs.recover import recovery

    inst = SimpleNamespace(id="i-4", zone="us-east-1a")
    monkeypatch.setattr(resources, "provision", lambda *a, **kw: [inst])
    monkeypatch.setattr(instances, "tag_nodes", lambda ec2, found, name, first_index: found)
    monkeypatch.setattr(recovery, "attempt_row", lambda attempt, i, node: {"instance_id": i.id, "node": node})
    monkeypatch.setattr(N, "open_node", lambda *a: None)
    monkeypatch.setattr(N, "prepare_node", lambda nd, say: None)
    monkeypatch.setattr(sc, "write", lambda path, text: None)
    monkeypatch.setattr(sc, "render", lambda entries, path: "")
    sent = {}

    def upload_node(nd, job, config, run_id, ips, resume, checkpoints, say, rank=None):
        sent.update(ips=ips, rank=nd.index if rank is None else rank)
    monkeypatch.setattr(engine, "upload_node", upload_node)
    node = SimpleNamespace(host="127.0.0.5", port=22, instance_id="i-4")
    monkeypatch.setattr(N, "Node", lambda index, i: SimpleNamespace(index=index, instance=i, **vars(node)))
    ctx = SimpleNamespace(aws=SimpleNamespace(ec2=None), settings=SimpleNamespace(ssh_user="ubuntu", home=tmp_path),
                          opts=SimpleNamespace(name=None), run_id="r1", prov=SimpleNamespace(key_path=tmp_path / "k"),
                          backend=SimpleNamespace(private_address=lambda i: "10.0.0.4"),
                          job=SimpleNamespace(mounts=[], task=SimpleNamespace(setup=None)), attempt=1, attempts=[],
                          ssh_config=tmp_path / "r1.config", join=lambda nd, at, log: None)
    monkeypatch.setattr(grow, "replace", lambda opts, **kw: opts)
    rep = grow.Replacement("i-2", 4)
    nd = grow._make(ctx, rep, None, ["10.0.0.0", "10.0.0.1", "10.0.0.2"], grow._Aside(SimpleNamespace(
        note=lambda t: None, log=lambda t: None), ""))
    assert nd.index == 4 and rep.address == "10.0.0.4"  # the index stays the one its tags have
    assert sent["ips"][sent["rank"]] == "10.0.0.4" and sent["ips"][0] == "10.0.0.0"


def test_an_array_run_is_refused_without_the_pool_handed_in():
    """runs/ never imports pool/: pipeline.run_job runs an array only with the pool's attempt handed in
    (api/tasks.start hands pool/attempt.run_attempt), and says so before anything else."""
    from types import SimpleNamespace

    from ec2gpu.runs.options import PoolOptions
    from ec2gpu.runs.provision import pipeline

    opts = PoolOptions(instance_type="g4dn.xlarge", nodes=2, task=SimpleNamespace(name="arr", builtin=None),
                       elements=tuple(arrays.elements(2, None, None)))
    touched = SimpleNamespace()  # no attribute: any AWS call would raise AttributeError, not ValueError
    with pytest.raises(ValueError, match="pool_attempt"):
        pipeline.run_job(touched, touched, opts, touched)
