"""ami/install-cuda.sh's branches, with a stand-in sysfs PCI tree and stand-ins for apt-get,
ubuntu-drivers, cloud-init, nvidia-smi, systemctl and lspci (this project's machines have no NVIDIA
GPU): each records how it was called."""
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ec2gpu" / "ami" / "install-cuda.sh"
#: what `ubuntu-drivers list --gpgpu` prints on noble (ubuntu-drivers-common 0.9.7.6ubuntu3.x) on an
#: AWS kernel: the headless metapackage, then its prebuilt kernel modules (the click `list` command
#: prints "%s, (kernel modules provided by %s)"); a newer non-server branch and -open flavours too
NOBLE = ("nvidia-headless-no-dkms-580-open, (kernel modules provided by linux-modules-nvidia-580-open-aws)\n"
         "nvidia-headless-no-dkms-570-server-open, (kernel modules provided by linux-modules-nvidia-570-server-open-aws)\n"
         "nvidia-headless-no-dkms-570-server, (kernel modules provided by linux-modules-nvidia-570-server-aws)\n"
         "nvidia-headless-no-dkms-535-server, (kernel modules provided by linux-modules-nvidia-535-server-aws)\n")
#: the older releases' form of the same listing
OLDER = ("nvidia-driver-535-server, (kernel modules provided by linux-modules-nvidia-535-server-generic)\n"
         "nvidia-driver-570-server, (kernel modules provided by linux-modules-nvidia-570-server-generic)\n"
         "nvidia-driver-570-server-open, (kernel modules provided by linux-modules-nvidia-570-server-open-generic)\n")
T4 = {"0000:00:1e.0": ("0x10de", "0x030200")}  # NVIDIA, 3D controller
ENA = {"0000:00:05.0": ("0x1d0f", "0x020000")}  # Amazon ENA, network controller
NVSWITCH = {"0000:a0:00.0": ("0x10de", "0x068000")}  # NVIDIA, bridge: not a GPU


def sysfs(root: Path, devices: dict) -> Path:
    """A stand-in /sys/bus/pci/devices: one directory per device with its vendor and class files."""
    root.mkdir()
    for address, (vendor, cls) in devices.items():
        (root / address).mkdir()
        (root / address / "vendor").write_text(vendor + "\n")
        (root / address / "class").write_text(cls + "\n")
    return root


def stand_ins(bin_: Path, calls: Path, listing: str, driver_loaded: bool) -> None:
    bin_.mkdir()
    (bin_ / "listing").write_text(listing)
    scripts = {
        "lspci": f'echo "lspci $*" >> {calls}',
        "apt-get": f'echo "apt-get[${{DEBIAN_FRONTEND:-}}] $*" >> {calls}',
        "systemctl": f'echo "systemctl $*" >> {calls}',
        "cloud-init": f'echo "cloud-init $*" >> {calls}',
        # the apt-get that ubuntu-drivers runs reads its lock timeout from $APT_CONFIG
        "ubuntu-drivers": (f'echo "ubuntu-drivers[${{DEBIAN_FRONTEND:-}}][$(cat "${{APT_CONFIG:-/dev/null}}")] $*" '
                           f'>> {calls}; [ "$1" = list ] && cat {bin_}/listing; true'),
        # the driver answers once it is "loaded": after a reboot, or at once when driver_loaded
        "nvidia-smi": (f'[ -e {bin_}/loaded ] || exit 9; echo "nvidia-smi $*" >> {calls}; '
                       'case "$*" in -L) echo "GPU 0: Tesla T4";; *) echo 570.86.15;; esac'),
    }
    for name, body in scripts.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    if driver_loaded:
        (bin_ / "loaded").touch()


def run(tmp_path, devices=None, listing=NOBLE, itype="g4dn.xlarge", gpus="1", driver_loaded=False, **env_extra):
    calls = tmp_path / "calls"
    calls.touch()
    bin_, pci = tmp_path / "bin", tmp_path / "pci"
    if not bin_.exists():
        stand_ins(bin_, calls, listing, driver_loaded)
        sysfs(pci, {**ENA, **T4} if devices is None else devices)
    env = {**{k: v for k, v in os.environ.items() if k != "EC2GPU_SANDBOX_INSTANCE"}, "PATH": f"{bin_}:/usr/bin:/bin",
           "EC2GPU_PCI_DEVICES": str(pci), **env_extra}
    done = subprocess.run(["bash", str(SCRIPT), itype, gpus], env=env, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines()


def installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith(("apt-get", "ubuntu-drivers")) and " list " not in f"{c} "]


@pytest.mark.parametrize("listing", [NOBLE, OLDER], ids=["noble", "older"])
def test_the_newest_proprietary_server_branch_is_installed_with_its_utils_then_a_reboot_is_asked_for(tmp_path, listing):
    done, calls = run(tmp_path, listing=listing)
    assert done.returncode == 100, done.stdout + done.stderr
    assert [c.split("] ", 1)[-1] for c in calls if c.startswith("ubuntu-drivers") and "install" in c] == \
        ["install --gpgpu nvidia:570-server"]  # not 580 (no server branch), not -open
    assert "apt-get[noninteractive] -o DPkg::Lock::Timeout=600 install -y -qq nvidia-utils-570-server" in calls
    assert not [c for c in calls if "fabricmanager" in c or c.startswith("lspci")]  # no NVSwitch; no lspci needed
    (tmp_path / "bin" / "loaded").touch()  # the reboot loaded the driver
    (tmp_path / "calls").write_text("")
    again, calls = run(tmp_path)
    assert again.returncode == 0 and "answers: nothing to install" in again.stdout
    assert not installs(calls)


def test_apt_waits_for_cloud_init_and_every_apt_get_for_the_dpkg_lock(tmp_path):
    """A fresh Ubuntu 24.04 runs unattended-upgrades at first boot, holding the dpkg lock for minutes."""
    done, calls = run(tmp_path)
    assert done.returncode == 100
    first_apt = next(i for i, c in enumerate(calls) if c.startswith("apt-get"))
    assert calls.index("cloud-init status --wait") < first_apt
    apt = [c for c in calls if c.startswith("apt-get")]
    assert len(apt) == 3 and all(c.startswith("apt-get[noninteractive] -o DPkg::Lock::Timeout=600 ") for c in apt)
    (install,) = [c for c in calls if c.startswith("ubuntu-drivers") and "install" in c]
    assert install.startswith('ubuntu-drivers[noninteractive][DPkg::Lock::Timeout "600";]')


def test_a_gpu_instance_type_whose_gpu_is_not_on_the_pci_bus_fails_instead_of_baking_a_cpu_image(tmp_path):
    done, calls = run(tmp_path, devices={**ENA, **NVSWITCH}, itype="p4d.24xlarge", gpus="8")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "p4d.24xlarge has 8 NVIDIA GPU(s) but none is on this machine's PCI bus" in " ".join(done.stderr.split())
    assert not installs(calls)


def test_a_machine_without_an_nvidia_gpu_whose_type_has_none_installs_nothing(tmp_path):
    done, calls = run(tmp_path, devices=ENA, gpus="0")
    assert done.returncode == 0 and "no NVIDIA GPU on this machine" in done.stdout
    assert not installs(calls)


@pytest.mark.parametrize("itype", ["p4d.24xlarge", "p5.48xlarge"])
def test_nvswitch_systems_also_get_fabric_manager_of_the_same_branch(tmp_path, itype):
    done, calls = run(tmp_path, devices={**T4, **NVSWITCH}, itype=itype, gpus="8")
    assert done.returncode == 100
    assert "apt-get[noninteractive] -o DPkg::Lock::Timeout=600 install -y -qq nvidia-fabricmanager-570" in calls
    assert "systemctl enable nvidia-fabricmanager" in calls


def test_no_server_driver_offered_fails_with_the_way_out_and_what_was_offered(tmp_path):
    offered = "nvidia-headless-no-dkms-580-open, (kernel modules provided by linux-modules-nvidia-580-open-aws)\n"
    done, calls = run(tmp_path, listing=offered)
    assert done.returncode == 1 and "offers no server driver" in done.stderr and "--from dlami" in done.stderr
    assert "nvidia-headless-no-dkms-580-open" in done.stderr
    assert not [c for c in installs(calls) if "install --gpgpu" in c or "nvidia-utils" in c]


def test_a_gpu_count_that_is_not_a_number_is_refused(tmp_path):
    done, calls = run(tmp_path, gpus="one")
    assert done.returncode == 2 and "GPU_COUNT must be a whole number" in done.stderr and calls == []


def test_a_sandbox_instance_never_installs_a_driver_on_the_machine_it_runs_on(tmp_path):
    """A sandbox instance's system is the host's: even with an NVIDIA GPU there, nothing is installed."""
    done, calls = run(tmp_path, EC2GPU_SANDBOX_INSTANCE="i-0123")
    assert done.returncode == 0 and "no driver installed" in done.stdout and not installs(calls)
