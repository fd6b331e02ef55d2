"""The remote layer against a real OpenSSH sshd on a loopback address."""

import getpass
import os
import shlex
import shutil
from pathlib import Path

import pytest

from ec2gpu.aws.network import generate_key
from ec2gpu.errors import RemoteError
from ec2gpu.remote import jobs, ssh, sync
from ec2gpu.sandbox import sshd


@pytest.fixture
def server(start_sshd):
    return start_sshd("i-test0001", "127.0.0.99")


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
    """A stopped and started instance answers at a new address: a key an older version pinned under
    its earlier address is accepted there (and pinned under the instance id, where OpenSSH's
    HostKeyAlias looks) whatever the console says; another key is refused."""
    inst, _, known = server
    _connect(server).close()
    pinned = known.read_text().split()
    known.write_text(f"[127.0.0.98]:2222 {pinned[1]} {pinned[2]}\n")  # pinned when it was at another address
    notes = []
    _connect(server, log=notes.append, fingerprints=lambda: []).close()
    assert "pinned for this instance at an earlier address, now pinned under i-test0001" in notes[0]
    assert [line.split()[0] for line in known.read_text().splitlines()] == ["[127.0.0.98]:2222", inst.instance_id]
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


def test_the_files_a_start_writes_are_private_and_never_written_through_what_was_left_there(server, tmp_path):
    """Issue 44.4: the agent's key and the hand-over's URLs are written by the command that starts
    the agent, from its stdin (never a command line), 0600 from the start; a link or a pipe a setup
    left under their names is replaced, not written through (or waited on)."""
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r4")
    ssh.run(conn, f"mkdir -p {run_dir}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("the user's own file\n")
    os.symlink(elsewhere, f"{run_dir}/agent.key")
    os.mkfifo(f"{run_dir}/handover.json")
    for name in ("console.log", "exit_status.tmp"):  # what the start command and job.sh write, too
        os.symlink(elsewhere, f"{run_dir}/{name}")
    key, doc = "ab" * 32, '{"urls": {"log": "https://b.s3/x?X-Amz-Signature=s"}, "wait_s": 2}'
    jobs.start(conn, run_dir, ["bash", "-c", "stat -c %a agent.key handover.json; cat agent.key; echo; cat handover.json"],
               private={"agent.key": key, "handover.json": doc})
    assert jobs.follow(conn, run_dir, "console.log", jobs.LogCursor(lambda b: None), poll_s=0.05, timeout_s=20) == 0
    assert Path(run_dir, "console.log").read_text() == f"600\n600\n{key}\n{doc}"
    assert elsewhere.read_text() == "the user's own file\n"
    for bad in ({"../agent.key": key}, {"agent.key": "two\nlines"}):
        with pytest.raises(ValueError):
            jobs.start(conn, run_dir, ["true"], private=bad)
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


def _hostile_home(conn, run_dir: str) -> None:
    """What a hostile job does on its instance: shell functions in ~/.bashrc (sshd's non-interactive
    commands read it) that list names leading out of the run directory, a symbolic link to a
    directory outside, a FIFO, and a file whose name holds a newline."""
    ssh.run(conn, f"mkdir -p {run_dir}/out/sub && printf 'a' > {run_dir}/out/x.txt && printf 'bb' > {run_dir}/out/sub/y.json"
                  f" && printf 'nl' > {run_dir}/out/$'new\\nline.txt' && ln -s /etc {run_dir}/out/etc-link"
                  f" && ln -s /etc/hostname {run_dir}/out/hostname-link && mkfifo {run_dir}/out/fifo")
    bashrc = ("find() { printf '../dotdot_written.txt\\0/tmp/abs_written.txt\\0x.txt\\0'; }\n"
              "rsync() { command rsync \"$@\"; }\n")
    ssh.run(conn, f"printf %s {shlex.quote(bashrc)} >> ~/.bashrc")


def _rsync_config(server, tmp_path):
    from ec2gpu.remote import ssh_config as sc
    inst, key, known = server
    config = tmp_path / "ssh.config"
    sc.write(config, sc.render([sc.HostEntry((inst.instance_id,), inst.host, inst.port, getpass.getuser(), key, known)],
                               config))
    return config


@pytest.mark.parametrize("how", ["sftp", "rsync"])
def test_pull_brings_home_regular_files_only_and_never_a_name_the_instance_chose_outside(server, tmp_path, how):
    """Issue 26.1: the instance's shell listed '../dotdot_written.txt' and an absolute name, and the
    controller wrote both outside the run (and overwrote an existing file). Now: the listing is
    SFTP's, names are checked, and only regular files inside the directory come home."""
    if how == "rsync" and not shutil.which("rsync"):
        pytest.skip("no rsync here")
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r2")
    _hostile_home(conn, run_dir)
    local = tmp_path / "run" / "outputs"
    outside = tmp_path / "run" / "dotdot_written.txt"
    outside.parent.mkdir(parents=True)
    outside.write_text("the user's own file")
    warned = []
    got, used = sync.pull(conn, f"{run_dir}/out", local, [], _rsync_config(server, tmp_path) if how == "rsync" else None,
                          server[0].instance_id, warn=warned.append)
    assert used == how and sorted(got) == ["new\nline.txt", "sub/y.json", "x.txt"]
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*")) == ["new\nline.txt", "sub", "sub/y.json",
                                                                                "x.txt"]
    assert not any(p.is_symlink() for p in local.rglob("*")) and (local / "sub" / "y.json").read_text() == "bb"
    assert outside.read_text() == "the user's own file" and not Path("/tmp/abs_written.txt").exists()
    conn.close()


def test_pull_skips_a_name_whose_place_here_is_a_link_leading_out_and_says_so(server, tmp_path):
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r3")
    ssh.run(conn, f"mkdir -p {run_dir}/out/escape && printf 'evil' > {run_dir}/out/escape/x && printf ok > {run_dir}/out/ok")
    local, target = tmp_path / "outputs", tmp_path / "elsewhere"
    local.mkdir()
    target.mkdir()
    (local / "escape").symlink_to(target)  # a link on this machine (the user's own): never written through
    warned = []
    got, _ = sync.pull(conn, f"{run_dir}/out", local, [], None, "i-test0001", warn=warned.append)
    assert got == ["ok"] and list(target.iterdir()) == []
    assert len(warned) == 1 and "'escape/x'" in warned[0] and "link" in warned[0]
    conn.close()


def test_pull_stops_at_its_limits_and_names_what_it_left(server, tmp_path):
    """Issue 26.7: 5,000 files and a 2 GB sparse file were all written here with no word."""
    from ec2gpu.remote import files
    conn = _connect(server)
    run_dir = jobs.remote_run_dir(conn, "r4")
    ssh.run(conn, f"mkdir -p {run_dir}/out && cd {run_dir}/out && for i in $(seq 1 50); do printf x > f$i; done"
                  " && truncate -s 2G sparse.bin")
    warned = []
    got, _ = sync.pull(conn, f"{run_dir}/out", tmp_path / "o", [], None, "i", files.Limits(files=10, bytes=1 << 20),
                       warn=warned.append)
    assert len(got) == 10 and not (tmp_path / "o" / "sparse.bin").exists()
    assert len(warned) == 1 and "41 files" in warned[0] and "ec2gpu fetch RUN --max-download" in warned[0]
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


def test_the_host_key_is_pinned_under_the_instance_id_so_paramiko_and_openssh_accept_a_new_address(server, tmp_path):
    """Issue 27.11: the key is pinned under the instance id (OpenSSH's HostKeyAlias, the same name
    in paramiko's lookup), not the address: the instance answering elsewhere (its sshd moved, as
    after a stop and start: same host key, another address and port) is reached by both with
    StrictHostKeyChecking yes and nothing added; a key an older version pinned under an address is
    pinned under the id too; another key under the id is refused by both."""
    import subprocess

    from ec2gpu.remote import ssh_config as sc
    inst, key, known = server
    user = getpass.getuser()
    _connect(server).close()
    pinned = known.read_text()
    assert [line.split()[0] for line in pinned.splitlines()] == [inst.instance_id]
    moved_dir = tmp_path / "moved"
    moved_dir.mkdir()
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):
        shutil.copy2(inst.directory / name, moved_dir / name)
    moved = sshd.start(inst.instance_id, moved_dir, "127.0.0.98", (inst.directory / "authorized_keys").read_text(), {})
    try:
        ssh.wait_for_ssh(moved.host, moved.port, user, key, known, timeout_s=20, fingerprints=lambda: []).close()
        config = tmp_path / "ssh_config"
        sc.write(config, sc.render([sc.HostEntry((inst.instance_id,), moved.host, moved.port, user, key, known)],
                                   config))
        assert "StrictHostKeyChecking yes" in config.read_text() and "accept-new" not in config.read_text()
        openssh = [shutil.which("ssh"), "-F", str(config), "-o", "BatchMode=yes", inst.instance_id, "true"]
        done = subprocess.run(openssh, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert known.read_text() == pinned  # the same pin, whatever the address
        # a file an older version wrote, the key under the address it had then
        known.write_text(f"[{inst.host}]:{inst.port} {' '.join(pinned.split()[1:3])}\n")
        assert subprocess.run(openssh, capture_output=True, timeout=30).returncode == 255  # not under the id yet
        assert ssh.pin_under_alias(known, inst.instance_id)  # what ssh-config, ssh, tunnel and start do first
        assert subprocess.run(openssh, capture_output=True, timeout=30).returncode == 0
        _, other = generate_key()
        known.write_text(f"{inst.instance_id} {other}\n")
        with pytest.raises(RemoteError, match="not the one pinned for this instance"):
            ssh.connect(moved.host, moved.port, user, key, known)
        refused = subprocess.run(openssh, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
        assert known.read_text() == f"{inst.instance_id} {other}\n"  # nothing pinned beside it
    finally:
        sshd.stop(moved.pid, moved.instance_id)


def test_a_host_key_of_another_type_than_the_pinned_one_is_refused_even_without_console_fingerprints(server):
    """A pinned instance that answers with a key of another type (an attacker offering only the
    type not pinned) is refused: never trusted on first use again."""
    import paramiko
    inst, _, known = server
    other = paramiko.ECDSAKey.generate()
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text(f"{known.name} {other.get_name()} {other.get_base64()}\n")
    with pytest.raises(RemoteError, match="not the one pinned"):
        _connect(server, fingerprints=lambda: [])
    assert known.read_text().count("\n") == 1  # nothing pinned beside it
