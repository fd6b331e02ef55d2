"""Ctrl-C while every node's log is followed (runs/execute/nodes.follow_all): the followers end before the
controller goes on to bring the job's records home and tear down (issue 27, item 12)."""
import _thread
import signal
import threading
import time

import pytest

from ec2gpu.runs.execute import nodes as N
from datetime import datetime, timezone
from ec2gpu.aws.instances import Instance


class _Ui:
    def log(self, line):
        pass

    def note(self, text):
        pass

    def progress(self, p):
        pass


def test_ctrl_c_returns_only_once_every_follower_has_ended(monkeypatch, tmp_path):
    """After Ctrl-C interrupted a Thread.join, the next join returned at once (CPython 3.11) while the
    follower still ran: it then teed lines the job wrote as it was being stopped, beside the copy
    of its log being brought home. follow_all now waits on each follower's own Event."""
    ended = []

    def follower(nd, tee, log_name, unreachable_s, mask, show, note, stop, progress=None):
        stop.wait(5)  # a poll that takes a while to notice the stop
        time.sleep(0.5)
        nd.result = "stopped"
        ended.append(nd.index)
    monkeypatch.setattr(N, "_follow_node", follower)
    nodes = [N.Node(k, Instance(f"i-{k}", "g4dn.xlarge", "running", datetime.now(timezone.utc))) for k in range(2)]
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever ran before
    try:
        threading.Timer(0.3, _thread.interrupt_main).start()  # Ctrl-C while following
        with pytest.raises(KeyboardInterrupt):
            N.follow_all(nodes, _Ui(), tmp_path, 1, 1.0)
    finally:
        signal.signal(signal.SIGINT, before)
    assert sorted(ended) == [0, 1] and all(nd.result == "stopped" for nd in nodes)


def test_the_records_that_cannot_come_home_in_time_do_not_hold_up_the_teardown(tmp_path):
    """A node whose SSH hangs after Ctrl-C: records_home_on_interrupt gives up at its budget and
    says so, so the instances are still terminated (a supervisor's SIGTERM has a deadline too)."""
    release = threading.Event()

    def connect():  # an SSH connection that does not open in time, then fails
        release.wait(30)
        raise OSError("unreachable")
    instance = Instance("i-0", "g4dn.xlarge", "running", datetime.now(timezone.utc))
    nd = N.Node(0, instance, pid=123, conn=object(), run_dir="/r", result="stopped", connect=connect)
    said = []
    try:
        N.records_home_on_interrupt([nd], lambda line: line, tmp_path, said.append, wait_s=0.1, budget_s=0.3)
    finally:
        release.set()
    assert said and said[-1].startswith("warning: the job's log and status did not all come home in 0 s")


def test_parallel_over_no_nodes_is_nothing():
    """A pool of one instance has no workers: setting up "each worker" is no call, not a
    ThreadPoolExecutor of 0 threads (ValueError)."""
    from ec2gpu.runs.execute import nodes as N
    assert N.parallel(lambda nd: 1 / 0, []) == []
    assert N.parallel(lambda nd: nd * 2, [1, 2]) == [2, 4]
