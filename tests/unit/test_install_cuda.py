"""ami/install-cuda.sh's branches, with stand-ins for lspci, apt-get, ubuntu-drivers, nvidia-smi,
systemctl (this project's machines have no NVIDIA GPU): each records how it was called."""
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ec2gpu" / "ami" / "install-cuda.sh"
T4 = "00:1e.0 0302: 10de:1eb8 (rev a1)"
LIST = ("nvidia-driver-535-server, (kernel modules provided by linux-modules-nvidia-535-server-generic)\n"
        "nvidia-driver-570-server, (kernel modules provided by linux-modules-nvidia-570-server-generic)\n"
        "nvidia-driver-570-server-open, (kernel modules provided by linux-modules-nvidia-570-server-open-generic)\n")


def stand_ins(bin_: Path, calls: Path, pci: str, listing: str, driver_loaded: bool) -> None:
    bin_.mkdir()
    scripts = {
        "lspci": f'echo "$0 $*" >> {calls}; printf "%s\\n" "{pci}"',
        "apt-get": f'echo "apt-get $*" >> {calls}',
        "systemctl": f'echo "systemctl $*" >> {calls}',
        "ubuntu-drivers": f'echo "ubuntu-drivers $*" >> {calls}; [ "$1" = list ] && printf "%s" "{listing}"; true',
        # the driver answers once it is "loaded": after a reboot, or at once when driver_loaded
        "nvidia-smi": (f'[ -e {bin_}/loaded ] || exit 9; echo "nvidia-smi $*" >> {calls}; '
                       'case "$*" in -L) echo "GPU 0: Tesla T4";; *) echo 570.86.15;; esac'),
    }
    for name, body in scripts.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    if driver_loaded:
        (bin_ / "loaded").touch()


def run(tmp_path, pci=T4, listing=LIST, itype="g4dn.xlarge", driver_loaded=False):
    calls = tmp_path / "calls"
    calls.touch()
    bin_ = tmp_path / "bin"
    if not bin_.exists():
        stand_ins(bin_, calls, pci, listing, driver_loaded)
    env = {**os.environ, "PATH": f"{bin_}:/usr/bin:/bin"}
    done = subprocess.run(["bash", str(SCRIPT), itype], env=env, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines()


def test_a_machine_without_an_nvidia_gpu_installs_nothing(tmp_path):
    done, calls = run(tmp_path, pci="")
    assert done.returncode == 0 and "no NVIDIA GPU on this machine" in done.stdout
    assert not [c for c in calls if c.startswith(("apt-get", "ubuntu-drivers"))]


def test_the_newest_server_branch_is_installed_then_a_reboot_is_asked_for_and_the_rerun_changes_nothing(tmp_path):
    done, calls = run(tmp_path)
    assert done.returncode == 100, done.stdout + done.stderr
    assert "ubuntu-drivers install --gpgpu nvidia:570-server" in calls
    assert "apt-get install -y -qq nvidia-utils-570-server" in calls
    assert not [c for c in calls if "fabricmanager" in c]  # a g4dn has no NVSwitch
    (tmp_path / "bin" / "loaded").touch()  # the reboot loaded the driver
    (tmp_path / "calls").write_text("")
    again, calls = run(tmp_path)
    assert again.returncode == 0 and "answers: nothing to install" in again.stdout
    assert not [c for c in calls if c.startswith(("apt-get", "ubuntu-drivers"))]


@pytest.mark.parametrize("itype", ["p4d.24xlarge", "p5.48xlarge"])
def test_nvswitch_systems_also_get_fabric_manager(tmp_path, itype):
    done, calls = run(tmp_path, itype=itype)
    assert done.returncode == 100
    assert "apt-get install -y -qq nvidia-fabricmanager-570" in calls and "systemctl enable nvidia-fabricmanager" in calls


def test_no_server_driver_offered_fails_with_the_way_out(tmp_path):
    done, calls = run(tmp_path, listing="nvidia-driver-570-open, (kernel modules)\\n")
    assert done.returncode == 1 and "offers no server driver" in done.stderr and "--from dlami" in done.stderr
