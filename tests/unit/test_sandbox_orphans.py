"""The sandbox stops every process of an instance, also one started while the others were being
stopped (user data starting the idle watcher as the instance is stopped)."""
import contextlib
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


# as Ray's raylet: a marked process starts one without the marker (the raylet's agents get an
# environment of their own), and the shell that started it (`ray start`'s SSH session) has gone
RAYLET = f"env -u {sshd.MARKER} sleep 301 & echo $! > agent.pid; exec sleep 302"


def _raylet(home, instance_id):
    home.mkdir(parents=True)
    env = {**os.environ, sshd.MARKER: instance_id, "HOME": str(home)}
    subprocess.run(["bash", "-c", f"bash -c '{RAYLET}' &"], cwd=home, env=env, start_new_session=True, check=True)
    deadline = time.monotonic() + 10
    while not ((home / "agent.pid").exists() and (home / "agent.pid").read_text().strip()):
        assert time.monotonic() < deadline, "the stand-in raylet did not start its agent"
        time.sleep(0.05)
    agent = psutil.Process(int((home / "agent.pid").read_text()))
    # `$!` names the forked shell before it execs `env -u ...` and then sleep: until then it still has the marker
    while agent.name() != "sleep":
        assert time.monotonic() < deadline, "the stand-in agent did not exec sleep"
        time.sleep(0.01)
    assert sshd.MARKER not in agent.environ()
    return agent


def _kill(agent):
    with contextlib.suppress(psutil.NoSuchProcess):
        agent.kill()


def test_stopping_an_instance_stops_the_processes_its_processes_start_without_the_marker(tmp_path):
    agent = _raylet(tmp_path / "instances" / "i-ray1" / "home", "i-ray1")
    sshd_stand_in = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        sshd.stop(sshd_stand_in.pid, "i-ray1", grace_s=2)
        assert not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE
        assert _gone("i-ray1")
    finally:
        _kill(agent)
        sshd_stand_in.kill()
        sshd_stand_in.wait()


def test_orphans_of_a_killed_sandbox_include_the_processes_its_instances_start_without_the_marker(tmp_path):
    instances = tmp_path / "instances"
    agent = _raylet(instances / "i-ray2" / "home", "i-ray2")
    try:
        assert agent.pid in sshd.orphans(instances, stop=True)
        assert not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE
    finally:
        _kill(agent)
