"""Settings precedence: flags > EC2GPU_* > ec2gpu.toml > defaults."""
import pytest

from ec2gpu import settings
from ec2gpu.errors import UsageError


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No EC2GPU_* or AWS region variables from the machine running the tests; an empty home."""
    import os
    for k in list(os.environ):
        if k.startswith("EC2GPU_") or k in ("AWS_REGION", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("EC2GPU_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_flags_beat_environment_beat_file_beat_aws_region(clean_env, tmp_path):
    cfg = tmp_path / "ec2gpu.toml"
    cfg.write_text('region = "eu-west-1"\ninstance_type = "g5.xlarge"\nroot_volume_gib = 120\n')
    clean_env.setenv("AWS_REGION", "sa-east-1")
    assert settings.load({"region": None}, cfg).region == "eu-west-1"  # the file beats the SDKs' variable
    clean_env.setenv("EC2GPU_REGION", "us-west-2")
    s = settings.load({"region": None}, cfg)
    assert (s.region, s.instance_type, s.root_volume_gib) == ("us-west-2", "g5.xlarge", 120)
    assert settings.load({"region": "ap-south-1"}, cfg).region == "ap-south-1"
    assert s.keys_dir == (tmp_path / "home").resolve() / "keys"
    cfg.unlink()
    clean_env.delenv("EC2GPU_REGION")
    assert settings.load().region == "sa-east-1"  # no file: AWS_REGION, as the AWS SDKs read it
    clean_env.delenv("AWS_REGION")
    clean_env.setenv("AWS_DEFAULT_REGION", "eu-north-1")
    assert settings.load().region == "eu-north-1"


def test_unknown_key_in_config_file_is_a_usage_error(clean_env, tmp_path):
    cfg = tmp_path / "ec2gpu.toml"
    cfg.write_text("regoin = 'x'\n")
    with pytest.raises(UsageError, match="regoin"):
        settings.load({}, cfg)


def test_sandbox_flag_from_environment(clean_env):
    clean_env.setenv("EC2GPU_SANDBOX", "1")
    assert settings.load({}).sandbox is True
    clean_env.setenv("EC2GPU_SANDBOX", "0")
    assert settings.load({}).sandbox is False
    clean_env.delenv("EC2GPU_SANDBOX")
    assert settings.load({}).sandbox is False


def test_every_command_reads_ec2gpu_sandbox_as_the_settings_do(clean_env):
    """One parser: `EC2GPU_SANDBOX=on` selects the sandbox for --local checks and `runs` as for the backend."""
    from ec2gpu.backend import sandbox_from_env
    clean_env.setenv("EC2GPU_SANDBOX", "on")
    assert sandbox_from_env() is True and settings.load().sandbox is True
    clean_env.setenv("EC2GPU_SANDBOX", "off")
    assert sandbox_from_env() is False and sandbox_from_env(True) is True


@pytest.mark.parametrize("name, value", [("EC2GPU_SANDBOX", "maybe"), ("EC2GPU_ROOT_VOLUME_GIB", "-5"),
                                         ("EC2GPU_MAX_DOWNLOAD_FILES", "many"), ("EC2GPU_MAX_DOWNLOAD_BYTES", "4 lots")])
def test_a_bad_value_is_one_usage_error_naming_the_setting(clean_env, name, value):
    """pydantic validates every setting: a typo is refused, never read as a default (issue 29 item 12)."""
    clean_env.setenv(name, value)
    with pytest.raises(UsageError, match=name.removeprefix("EC2GPU_").lower()) as exc:
        settings.load({})
    assert f"{value!r}: " in exc.value.message  # the value, then what it takes in words (issue 48 item 12)
    assert "Input should" not in exc.value.message


def test_sizes_in_settings_are_byte_sizes(clean_env):
    clean_env.setenv("EC2GPU_MAX_DOWNLOAD_BYTES", "2GiB")
    assert settings.load().download_limits.bytes == 2 << 30
    clean_env.delenv("EC2GPU_MAX_DOWNLOAD_BYTES")
    assert settings.load().download_limits.bytes == 4 << 30


def test_version_is_printed_and_exits_0(capsys):
    from ec2gpu import __version__, cli
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ec2gpu {__version__}"


def test_help_shows_no_type_after_on_off_flags(capsys):
    from ec2gpu import cli
    assert cli.main(["train", "mnist", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--spot" in shown and "<bool>" not in shown and "BOOLEAN" not in shown  # flags show no type


def test_a_tool_home_that_is_another_users_is_a_usage_error_with_a_hint(clean_env, tmp_path, capsys):
    """Review of issue 44 (round 3): with EC2GPU_HOME another user's, the chmod to 0700 raised and
    every command ended `error: PermissionError`, exit 1. Now one line in the user's words, exit 2."""
    import os
    import pathlib
    import pwd

    from ec2gpu import cli
    from ec2gpu.runs.settle import ledger
    home = tmp_path / "home"
    ledger.connect(home).close()  # a ledger there: `runs` opens it
    home.chmod(0o755)
    owner = pwd.getpwuid(home.stat().st_uid).pw_name
    said = f"error: the tool's home {home} is not yours to make private (mode 0755, owner {owner})"
    hint = "hint: set EC2GPU_HOME to a directory of your own"

    def refused(self, mode):
        raise PermissionError(1, "Operation not permitted")
    with clean_env.context() as patched:
        patched.setattr(pathlib.Path, "chmod", refused)  # what chmod says of another user's directory
        assert cli.main(["runs"]) == 2
    err = capsys.readouterr().err
    assert said in err and hint in err and "PermissionError" not in err
    home.chmod(0o700)
    clean_env.setattr(os, "geteuid", lambda: home.stat().st_uid + 1)  # 0700, but not this user's either
    assert cli.main(["runs"]) == 2
    assert f"is not yours to make private (mode 0700, owner {owner})" in capsys.readouterr().err
