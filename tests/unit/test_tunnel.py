"""remote/tunnel.py: a forward that drops is started again with a growing pause until stopped."""
import sys
import threading
import time

from ec2gpu.remote import tunnel


def test_a_dropped_forward_is_started_again_until_stopped(tmp_path):
    starts = tmp_path / "starts"
    command = [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('x')"]  # "SSH" that drops at once
    said, refreshed, stop = [], [], threading.Event()
    t = threading.Thread(target=tunnel.keep_forwarding, args=(command, tunnel.free_local_port(), stop, said.append),
                         kwargs={"refresh": lambda: refreshed.append(1), "max_pause_s": 0.2})
    t.start()
    deadline = time.monotonic() + 20
    while (not starts.exists() or len(starts.read_text()) < 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    t.join(10)
    assert not t.is_alive() and len(starts.read_text()) >= 3
    assert any(s.startswith("SSH ended (exit 0); reconnecting in") for s in said) and refreshed


def test_the_ssh_command_forwards_loopback_to_loopback_and_fails_rather_than_run_without_it(tmp_path):
    argv = tunnel.argv(tmp_path / "ssh_config", "i-0abc", 8888, 18888)
    assert argv[1:3] == ["-F", str(tmp_path / "ssh_config")] and argv[-1] == "i-0abc" and "-N" in argv
    assert "127.0.0.1:18888:127.0.0.1:8888" in argv and "ExitOnForwardFailure=yes" in argv


def test_the_forwards_ssh_runs_in_its_own_group_and_is_ended_and_reaped_by_whoever_stops_it():
    """Issue 27.14: the thread that is told to stop (the main thread, on SIGTERM or SIGHUP) ends
    the ssh itself, whatever the forwarding thread is doing (here: waiting for a port that never
    listens), and reaps it; nothing is started after."""
    import os
    command = [sys.executable, "-c", "import time; time.sleep(120)"]  # an ssh whose forward never listens
    stop, child = threading.Event(), tunnel.Child()
    t = threading.Thread(target=tunnel.keep_forwarding, args=(command, tunnel.free_local_port(), stop, lambda m: None),
                         kwargs={"child": child}, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while child.proc is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc = child.proc
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)  # a terminal's signals reach us, not it
        stop.set()
        child.close()
        assert proc.returncode is not None  # ended and reaped before close() returned
        assert child.start(command) is None
        t.join(10)
        assert not t.is_alive()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_task_files_ports_go_to_free_ports_here_and_only_ports_the_user_named_keep_theirs(tmp_path, monkeypatch):
    """Issue 44.7: a task file's `ports: [5432]` bound 127.0.0.1:5432 here when it was free, where a
    local psql would then send its password to the instance's job. Only --port keeps the number."""
    import socket
    with socket.socket() as a, socket.socket() as b:  # two ports free now: the task's and the user's
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        task_port, named = a.getsockname()[1], b.getsockname()[1]
    started = {}
    monkeypatch.setattr(tunnel, "keep_forwarding", lambda argv, here, stop, log, child: started.setdefault(
        int(argv[argv.index("-L") + 1].split(":")[3]), here))
    said = []
    with tunnel.forwarding(tmp_path / "ssh_config", "i-0abc", [task_port, named], said.append, same_ports=(named,)):
        pass
    assert started[named] == named and started[task_port] != task_port
    assert f"port {task_port} of i-0abc is at http://127.0.0.1:{started[task_port]} while the job runs" in said


def test_port_flags_are_checked_and_the_plan_says_which_local_port_each_gets(tmp_path):
    from ec2gpu import api
    from ec2gpu.errors import UsageError
    from ec2gpu.runs.plan import dryrun
    task = tmp_path / "task.yaml"
    task.write_text("name: p\nworkdir: null\nrun: python serve.py\nports: [5432]\n")
    plan = dryrun.plan(api.run(str(task), dry_run=True, ports=[6006]))
    assert [(p["port"], p["local"]) for p in plan["ports"]] == [
        (5432, "127.0.0.1:(a free port, said when the job starts)"), (6006, "127.0.0.1:6006")]
    import pytest
    for bad in (0, 70000, -1):
        with pytest.raises(UsageError, match=f"--port {bad} is not a TCP port"):
            api.run(str(task), dry_run=True, ports=[bad])


def test_a_head_off_this_machine_gets_the_named_ports_and_one_on_its_loopback_none():
    """foreground.run_attempt forwards --port's ports to the same port here for an EC2 head, and to free
    ports for a sandbox head on this machine's 127.0.0.N (it shares this machine's ports)."""
    from ec2gpu.runs.execute import foreground
    assert foreground.same_ports_for("54.210.3.4", (8888, 6006)) == (8888, 6006)
    assert foreground.same_ports_for("ec2-54-210-3-4.compute-1.amazonaws.com", (8888,)) == (8888,)
    assert foreground.same_ports_for("127.0.0.7", (8888, 6006)) == ()
    assert foreground.same_ports_for("54.210.3.4", ()) == ()
