"""Settings precedence: flags > EC2GPU_* > ec2gpu.toml > defaults."""
import pytest

from ec2gpu import settings
from ec2gpu.errors import UsageError


def test_flags_beat_environment_beat_file(tmp_path):
    cfg = tmp_path / "ec2gpu.toml"
    cfg.write_text('region = "eu-west-1"\ninstance_type = "g5.xlarge"\nroot_volume_gib = 120\n')
    env = {"EC2GPU_REGION": "us-west-2", "EC2GPU_HOME": str(tmp_path)}
    s = settings.load({"region": None}, env, cfg)
    assert (s.region, s.instance_type, s.root_volume_gib) == ("us-west-2", "g5.xlarge", 120)
    assert settings.load({"region": "ap-south-1"}, env, cfg).region == "ap-south-1"
    assert s.keys_dir == tmp_path.resolve() / "keys"


def test_unknown_key_in_config_file_is_a_usage_error(tmp_path):
    cfg = tmp_path / "ec2gpu.toml"
    cfg.write_text("regoin = 'x'\n")
    with pytest.raises(UsageError, match="regoin"):
        settings.load({}, {}, cfg)


def test_sandbox_flag_from_environment():
    assert settings.load({}, {"EC2GPU_SANDBOX": "1"}).sandbox is True
    assert settings.load({}, {}).sandbox is False


def test_version_is_printed_and_exits_0(capsys):
    from ec2gpu import __version__, cli
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ec2gpu {__version__}"


def test_help_shows_no_type_after_on_off_flags(capsys):
    from ec2gpu import cli
    assert cli.main(["train", "mnist", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--spot" in shown and "<bool>" not in shown and "BOOLEAN" not in shown  # flags show no type
