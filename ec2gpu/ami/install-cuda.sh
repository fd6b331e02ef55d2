#!/usr/bin/env bash
# Install the NVIDIA driver on a bare Ubuntu 24.04 instance (`ec2gpu image bake --from ubuntu-24.04`),
# with Ubuntu's documented commands for servers
# (https://documentation.ubuntu.com/server/how-to/graphics/install-nvidia-drivers/):
#   ubuntu-drivers list --gpgpu; ubuntu-drivers install --gpgpu nvidia:<branch>-server;
#   apt-get install nvidia-utils-<branch>-server   (nvidia-smi)
# and on the P family's NVSwitch systems (p4d, p4de, p5, p5e, p5en), NVIDIA Fabric Manager of the
# same branch, without which their GPUs do not initialise
# (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html).
# The G family (g4dn T4, g5 A10G, g6 L4) and p3/p4 need only the driver. torch's pip wheels bring
# their own CUDA runtime and cuDNN, so the driver is all torch needs; setup-gpu.sh installs torch.
#
# Idempotent: a driver that answers (nvidia-smi -L) is left alone; apt-get skips what is installed.
# Usage: install-cuda.sh [INSTANCE_TYPE]
# Exit status: 0 ready (or this machine has no NVIDIA GPU: nothing to install), 100 installed and a
# reboot is needed before the driver loads (the controller reboots the instance through EC2 and
# runs this again), anything else: failed.
#
# Not run on a GPU by this project (its machines have none): the install branch is tested with
# stand-in commands (tests/unit/test_install_cuda.py), the no-GPU branch on sandbox instances,
# and the reboot the controller makes on sandbox instances.
set -euo pipefail
REBOOT_NEEDED=100
itype=${1:-}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
driver_answers() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if driver_answers; then
  echo "NVIDIA driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1) answers: nothing to install"
  exit 0
fi
# PCI vendor 10de is NVIDIA; class 0302 (3D controller) or 0300 (VGA controller) is a GPU
if ! { lspci -n -d 10de: 2>/dev/null || true; } | grep -Eq ' 030[02]: '; then
  echo "no NVIDIA GPU on this machine (lspci lists none): no driver installed; torch will use the CPU"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
as_root apt-get update -qq
as_root apt-get install -y -qq ubuntu-drivers-common pciutils
# the newest server (data centre) branch Ubuntu offers for this GPU, e.g. "nvidia-driver-570-server"
branch=$(ubuntu-drivers list --gpgpu 2>/dev/null | sed -n 's/^nvidia-driver-\([0-9][0-9]*\)-server\b.*/\1/p' \
         | sort -n | tail -n 1)
if [ -z "$branch" ]; then
  echo "ubuntu-drivers offers no server driver for this GPU: install one by hand, or bake --from dlami" >&2
  exit 1
fi
echo "installing NVIDIA driver branch ${branch} (server) for ${itype:-this instance}"
as_root ubuntu-drivers install --gpgpu "nvidia:${branch}-server"
as_root apt-get install -y -qq "nvidia-utils-${branch}-server"
case "$itype" in
  p4d.*|p4de.*|p5.*|p5e.*|p5en.*)
    echo "${itype}: NVSwitch system: installing NVIDIA Fabric Manager ${branch}"
    as_root apt-get install -y -qq "nvidia-fabricmanager-${branch}"
    as_root systemctl enable nvidia-fabricmanager ;;
esac

if driver_answers; then
  echo "NVIDIA driver ${branch} loaded without a reboot"
  exit 0
fi
echo "NVIDIA driver ${branch} installed: the instance must reboot before it loads"
exit "$REBOOT_NEEDED"
