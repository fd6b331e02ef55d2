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
