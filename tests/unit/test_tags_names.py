"""Names and tag values that go into ssh_config Host lines are matched whole (issue 29): Python's ``$``
also matches before a final newline, so ``re.match`` with a pattern ending in ``$`` let "x\\n"
through, and a Name tag "x\\n" split a Host line of $EC2GPU_HOME/ssh_config (OpenSSH then refuses
the whole file)."""
from __future__ import annotations

import types

import pytest

from ec2gpu.aws import tags
from ec2gpu.errors import UsageError
from datetime import datetime, timezone
from ec2gpu.aws.instances import Instance


@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "abc\nProxyCommand x", "\nabc", "abc ", "", "-abc",
                                  "a" * 64])
def test_check_name_refuses_a_name_with_a_newline_or_another_unsafe_character(name):
    with pytest.raises(UsageError, match="is not a safe name"):
        tags.check_name(name)


@pytest.mark.parametrize("name", ["abc", "a", "run-1.2_x", "a" * 63])
def test_check_name_returns_a_safe_name_as_it_is(name):
    assert tags.check_name(name) == name


def test_check_name_names_the_flag_it_checks():
    with pytest.raises(UsageError, match="--task-name 'abc\\\\n' is not a safe name"):
        tags.check_name("abc\n", "--task-name")


@pytest.mark.parametrize("value", ["abc\n", "abc\r", "abc\nHost *", "abc def", "", None, "a" * 129])
def test_safe_refuses_a_tag_value_with_a_newline_or_another_unsafe_character(value):
    assert tags.safe(value) is False


@pytest.mark.parametrize("value", ["abc", "ec2gpu-20261122-170000-abcd", "train.v2_b-3", "a" * 128])
def test_safe_accepts_a_plain_tag_value(value):
    assert tags.safe(value) is True


def test_a_task_name_with_a_final_newline_is_refused_too():
    """tasks/spec.py checks a task's name with NAME_RE through pydantic (a Rust regex: ``$`` is the
    end of the text), and check_name with re.fullmatch: both refuse "abc\\n"."""
    from pydantic import ValidationError

    from ec2gpu.tasks.spec import Task
    with pytest.raises(ValidationError):
        Task(name="abc\n", run="echo hi")
    assert Task(name="abc", run="echo hi").name == "abc"


def _write_config(monkeypatch, tmp_path, name_tag: str):
    """runs/standing/hosts.write_ssh_config over one running instance tagged Name=``name_tag``, with
    EC2 and the host key's pinning faked: (the ssh_config text, the warnings said)."""
    from ec2gpu.aws import sweep
    from ec2gpu.remote import ssh
    from ec2gpu.runs.standing import hosts as standing

    inst = Instance("i-0123456789abcdef0", "g4dn.xlarge", "running", datetime.now(timezone.utc), key_name="ec2gpu-k",
                    tags={tags.RUN: "r1", tags.NAME: name_tag})
    monkeypatch.setattr(sweep, "find_instances", lambda ec2, **kw: [inst])
    monkeypatch.setattr(ssh, "pin_under_alias", lambda known_hosts, alias=None, log=None: True)
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "ec2gpu-k.pem").write_text("key")
    settings = types.SimpleNamespace(keys_dir=keys, home=tmp_path / "home", ssh_user="ubuntu")
    backend = types.SimpleNamespace(ssh_target=lambda i: ("203.0.113.7", 22))
    warned: list[str] = []
    path, entries, skipped = standing.write_ssh_config(types.SimpleNamespace(ec2=None), settings, backend,
                                                       warned.append)
    return path.read_text(), warned


def test_a_name_tag_with_a_final_newline_never_reaches_an_ssh_config_line(monkeypatch, tmp_path):
    text, warned = _write_config(monkeypatch, tmp_path, "web\n")
    hosts = [line for line in text.splitlines() if line.startswith("Host ")]
    assert hosts == ["Host i-0123456789abcdef0"]  # the instance id alone: the tag is left out
    assert "web" not in text
    # every line is a comment, blank, a Host line or one of its indented options: none split off
    assert all(not line or line.startswith(("#", "Host ", "    ")) for line in text.splitlines())
    assert len(warned) == 1 and "Name tag 'web\\n'" in warned[0] and "left out" in warned[0]


def test_a_safe_name_tag_is_the_host_lines_first_alias(monkeypatch, tmp_path):
    text, warned = _write_config(monkeypatch, tmp_path, "web")
    assert [line for line in text.splitlines() if line.startswith("Host ")] == ["Host web i-0123456789abcdef0"]
    assert warned == []


def test_an_instance_answers_to_its_id_and_the_tags_asked_only():
    from ec2gpu.aws import tags as T
    inst = Instance("i-1", "g4dn.xlarge", "running", datetime.now(timezone.utc),
                    tags={T.NAME: "dev", T.RUN: "r1", T.CLUSTER: "c"})
    assert T.answers_to(inst, "i-1") and T.answers_to(inst, "dev") and not T.answers_to(inst, "r1")
    assert T.answers_to(inst, "r1", (T.NAME, T.RUN, T.CLUSTER)) and T.answers_to(inst, "c", (T.CLUSTER,))
    assert not T.answers_to(inst, "") and not T.answers_to({"Tags": []}, "dev")
