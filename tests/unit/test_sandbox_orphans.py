"""The sandbox stops every process of an instance, also one started while the others were being
stopped (user data starting the idle watcher as the instance is stopped)."""
import os
import subprocess
import time

import psutil

from ec2gpu.sandbox import sshd

# on SIGTERM it starts another process of the instance, then exits: a first pass alone misses that one
SPAWNS_ON_TERM = "trap 'sleep 300 & exit 0' TERM; while :; do sleep 0.1; done"


def _instance_process(home, instance_id):
    env = {**os.environ, sshd.MARKER: instance_id, "HOME": str(home)}
    proc = subprocess.Popen(["bash", "-c", SPAWNS_ON_TERM], env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while proc.pid not in sshd.instance_processes(instance_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def _gone(instance_id):
    deadline = time.monotonic() + 5
    while sshd.instance_processes(instance_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not sshd.instance_processes(instance_id)


def test_stopping_an_instance_also_stops_what_its_processes_start_as_they_stop(tmp_path):
    proc = _instance_process(tmp_path / "instances" / "i-late1" / "home", "i-late1")
    try:
        sshd.stop(proc.pid, "i-late1", grace_s=2)
        proc.wait(5)
        assert _gone("i-late1")
    finally:
        for pid in sshd.instance_processes("i-late1"):  # by pid, whatever happened
            psutil.Process(pid).kill()


def test_orphans_of_a_killed_sandbox_are_stopped_with_what_they_start_as_they_stop(tmp_path):
    instances = tmp_path / "instances"
    proc = _instance_process(instances / "i-late2" / "home", "i-late2")
    try:
        assert proc.pid in sshd.orphans(instances, stop=True)
        proc.wait(5)
        assert _gone("i-late2")
    finally:
        for pid in sshd.instance_processes("i-late2"):
            psutil.Process(pid).kill()
