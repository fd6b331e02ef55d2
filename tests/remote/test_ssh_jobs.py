"""The remote layer against a real OpenSSH sshd on a loopback address."""

import pytest

from ec2gpu.aws.network import generate_key, write_private_key
from ec2gpu.errors import RemoteError
from ec2gpu.remote import jobs, ssh
from ec2gpu.sandbox import sshd


@pytest.fixture
def server(tmp_path):
    try:
        sshd.sshd_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    private, public = generate_key()
    key = tmp_path / "id.pem"
    write_private_key(key, private)
    inst = sshd.start("i-test0001", tmp_path / "inst", "127.0.0.99", public, {})
    yield inst, key, tmp_path / "known_hosts"
    sshd.stop(inst.pid, inst.instance_id)
    assert not sshd._alive(inst.pid)


def _connect(server, **kw):
    import getpass
    inst, key, known = server
    return ssh.wait_for_ssh(inst.host, inst.port, getpass.getuser(), key, known, timeout_s=20, **kw)


def test_host_key_is_pinned_on_first_use_and_a_changed_key_is_refused(server):
    notes = []
    conn = _connect(server, log=notes.append)
    conn.close()
    known = server[2]
    assert known.exists() and "ssh-ed25519" in known.read_text() and "first use" in notes[0]
    line = known.read_text().split()
    _, other = generate_key()
    known.write_text(f"{line[0]} {other}\n")
    with pytest.raises(RemoteError, match="host key"):
        _connect(server)


def test_at_a_new_address_only_the_key_pinned_for_the_instance_is_accepted(server):
    """A stopped and started instance answers at a new address: its pinned key is accepted there
    (and pinned for that address too) whatever the console says; another key is refused."""
    inst, _, known = server
    _connect(server).close()
    pinned = known.read_text().split()
    known.write_text(f"[127.0.0.98]:2222 {pinned[1]} {pinned[2]}\n")  # pinned when it was at another address
    notes = []
    _connect(server, log=notes.append, fingerprints=lambda: []).close()
    assert "is the one pinned for this instance at its earlier address" in notes[0]
    assert [line.split()[0] for line in known.read_text().splitlines()] == ["[127.0.0.98]:2222",
                                                                          f"[{inst.host}]:{inst.port}"]
    _, other = generate_key()
    known.write_text(f"[127.0.0.98]:2222 {other}\n")
    with pytest.raises(RemoteError, match="not the one pinned for this instance"):
        _connect(server, fingerprints=lambda: [])  # even when the console has no fingerprints to offer
    assert len(known.read_text().splitlines()) == 1  # nothing added


def test_host_key_matching_the_console_fingerprint_is_pinned_and_a_wrong_one_refused(server):
    from ec2gpu.aws.instances import parse_host_key_fingerprints
    from ec2gpu.sandbox.console import cloud_init_block
    inst, _, known = server
    console = "boot log\n" + cloud_init_block(inst.directory / "ssh_host_ed25519_key.pub", inst.instance_id)
    good = parse_host_key_fingerprints(console)
    assert len(good) == 1 and good[0].startswith("SHA256:")
    asked, notes = [], []
    _connect(server, log=notes.append, fingerprints=lambda: asked.append(1) or good).close()
    assert "verified against the console output" in notes[0] and known.exists() and asked
    known.unlink()
    _, other = generate_key()
    wrong = parse_host_key_fingerprints(cloud_init_block_for(other))
    with pytest.raises(RemoteError, match="not one the instance printed"):
        _connect(server, fingerprints=lambda: wrong)
    assert not known.exists()  # nothing pinned, nothing sent


def cloud_init_block_for(public_line: str) -> str:
    from ec2gpu.sandbox.console import fingerprint_of_public_key
    return ("-----BEGIN SSH HOST KEY FINGERPRINTS-----\n"
            f"256 {fingerprint_of_public_key(public_line)} root@x (ED25519)\n-----END SSH HOST KEY FINGERPRINTS-----\n")


def drop_connections(sshd_pid: int) -> int:
    """Kill the server side of every SSH connection (by pid), as a network drop would end them."""
    import os
    import signal
    kids = sshd.descendants(sshd_pid)  # the per-connection sshd-session processes
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
    return len(kids)


def test_job_survives_a_dropped_connection_and_its_log_is_followed_byte_for_byte(server):
    inst = server[0]
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r1")
    ssh.run(conn, f"mkdir -p {run_dir}")
    script = "for i in $(seq 1 12); do echo line $i >> out.log; sleep 0.25; done; exit 3"
    jobs.start(conn, run_dir, ["bash", "-c", script])
    polls, notes, got = [], [], bytearray()

    def on_poll(c):  # mid-job, the controller's connection dies under it
        polls.append(c)
        if len(polls) == 4:
            assert drop_connections(inst.pid) >= 1

    cursor = jobs.LogCursor(got.extend)
    status, conn = jobs.follow_reconnecting(lambda: _connect(server), run_dir, "out.log", cursor, conn=conn,
                                            on_poll=on_poll, log=notes.append, poll_s=0.1, unreachable_s=30)
    assert status == 3
    assert bytes(got) == b"".join(b"line %d\n" % i for i in range(1, 13)) and cursor.offset == len(got)
    assert any("connection lost" in n for n in notes) and any("reconnected" in n for n in notes), notes
    conn.close()


def test_follow_gives_up_when_ssh_stays_unreachable(server):
    inst = server[0]
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r3")
    ssh.run(conn, f"mkdir -p {run_dir}")
    jobs.start(conn, run_dir, ["sleep", "30"])
    sshd.stop(inst.pid, inst.instance_id)  # the instance is gone: its sshd and its job

    def refuse():
        raise ConnectionRefusedError("connection refused")
    with pytest.raises(jobs.Unreachable, match="unreachable"):
        jobs.follow_reconnecting(refuse, run_dir, "out.log", jobs.LogCursor(lambda b: None), conn=conn,
                                 unreachable_s=1.5, poll_s=0.1)


def test_failed_command_reports_command_host_status_and_output(server):
    conn = _connect(server)
    with pytest.raises(RemoteError) as exc:
        ssh.run(conn, "echo boom >&2; exit 7")
    assert exc.value.exit_status == 7 and "boom" in exc.value.tail and exc.value.host == server[0].host
    conn.close()


def test_fetch_downloads_every_file(server, tmp_path):
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r2")
    ssh.run(conn, f"mkdir -p {run_dir}/out && printf 'a' > {run_dir}/out/x.txt && printf 'bb' > {run_dir}/out/y.json")
    got = jobs.fetch(conn, f"{run_dir}/out", tmp_path / "dl")
    assert sorted(p.name for p in got) == ["x.txt", "y.json"] and (tmp_path / "dl" / "y.json").read_text() == "bb"
    conn.close()


def test_no_connection_before_the_console_shows_fingerprints_then_the_key_is_verified_not_trusted(server):
    from ec2gpu.aws.instances import parse_host_key_fingerprints
    from ec2gpu.sandbox.console import cloud_init_block
    inst, _, known = server
    good = parse_host_key_fingerprints(cloud_init_block(inst.directory / "ssh_host_ed25519_key.pub", inst.instance_id))
    answers = iter([[], [], good])  # cloud-init prints them after sshd already answers
    notes = []
    _connect(server, log=notes.append, fingerprints=lambda: next(answers)).close()
    assert any("waiting for" in n and "fingerprints" in n for n in notes)
    assert any("verified against the console output" in n for n in notes)
    assert not any("first use" in n for n in notes) and known.exists()


def test_trust_on_first_use_only_after_the_fingerprint_wait_and_said(server):
    notes = []
    _connect(server, log=notes.append, fingerprints=lambda: [], fingerprint_wait_s=1.0).close()
    assert any("no host key fingerprints" in n for n in notes) and any("first use" in n for n in notes)
