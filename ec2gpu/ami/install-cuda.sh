#!/usr/bin/env bash
# Install the NVIDIA driver on a bare Ubuntu 24.04 instance (`ec2gpu image bake --from ubuntu-24.04`),
# with Ubuntu's documented commands for servers
# (https://documentation.ubuntu.com/server/how-to/graphics/install-nvidia-drivers/):
#   ubuntu-drivers list --gpgpu; ubuntu-drivers install --gpgpu nvidia:<branch>-server;
#   apt-get install nvidia-utils-<branch>-server   (nvidia-smi, the same branch)
# and on the P family's NVSwitch systems (p4d, p4de, p5, p5e, p5en), NVIDIA Fabric Manager of the
# same branch, without which their GPUs do not initialise
# (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html).
# The G family (g4dn T4, g5 A10G, g6 L4) needs only the driver. torch's pip wheels bring
# their own CUDA runtime and cuDNN, so the driver is all torch needs; setup-gpu.sh installs torch.
#
# `ubuntu-drivers list --gpgpu` names one driver package a line, "PACKAGE, (kernel modules provided
# by MODULES)"; on noble (ubuntu-drivers-common 0.9.7.6ubuntu3.x) PACKAGE is the headless metapackage,
# e.g. "nvidia-headless-no-dkms-570-server, (kernel modules provided by
# linux-modules-nvidia-570-server-aws)", on older releases "nvidia-driver-570-server, ...". The
# branch is read from either name; -open flavours (NVIDIA's open kernel modules) are left out: the
# proprietary server branch is installed, with nvidia-utils and Fabric Manager of the same number.
#
# The GPU is found in sysfs (/sys/bus/pci/devices/*/vendor is 0x10de, class 0x0300xx or 0x0302xx),
# not with lspci: a bare Ubuntu image may not have pciutils. When the instance type has GPUs
# (GPU_COUNT, from DescribeInstanceTypes) and none is seen, the script fails rather than let the
# bake make an image without a driver.
#
# apt waits for what a fresh instance's first boot does with it: `cloud-init status --wait` first,
# then every apt-get (and the one ubuntu-drivers runs, through APT_CONFIG) waits up to
# APT_LOCK_TIMEOUT_S for the dpkg lock that unattended-upgrades may hold (apt.conf(5),
# DPkg::Lock::Timeout).
#
# Idempotent: a driver that answers (nvidia-smi -L) is left alone; apt-get skips what is installed.
# Usage: install-cuda.sh [INSTANCE_TYPE [GPU_COUNT]]
#   EC2GPU_PCI_DEVICES overrides /sys/bus/pci/devices (tests).
# Exit status: 0 ready (or this machine has no NVIDIA GPU and its type none, or it is a sandbox
# instance, EC2GPU_SANDBOX_INSTANCE set, whose system is the host's: nothing to install),
# 100 installed and a reboot is needed before the driver loads (the controller reboots the instance
# through EC2 and runs this again), 3 the type has GPUs but none is on the PCI bus, 2 bad
# arguments, anything else: failed.
#
# Not run on a GPU by this project (its machines have none): the install branch is tested with
# stand-in commands and a stand-in sysfs (tests/unit/test_install_cuda.py), the reboot the controller
# makes on sandbox instances.
set -euo pipefail
REBOOT_NEEDED=100
NO_GPU_SEEN=3
APT_LOCK_TIMEOUT_S=600
itype=${1:-}
expected=${2:-0}
pci=${EC2GPU_PCI_DEVICES:-/sys/bus/pci/devices}
case "$expected" in
  ''|*[!0-9]*) echo "GPU_COUNT must be a whole number, not '$expected'" >&2; exit 2 ;;
esac

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
# sudo resets the environment: the frontend and the lock timeout go on the command line
apt_get() { as_root env DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_TIMEOUT_S" "$@"; }
driver_answers() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
nvidia_gpus() {  # NVIDIA display controllers on the PCI bus (NVSwitches, class 0x0680, are not counted)
  local n=0 d
  for d in "$pci"/*; do
    if [ ! -r "$d/vendor" ] || [ ! -r "$d/class" ]; then continue; fi
    if [ "$(cat "$d/vendor")" = 0x10de ]; then
      case "$(cat "$d/class")" in 0x0300*|0x0302*) n=$((n + 1)) ;; esac
    fi
  done
  echo "$n"
}

if [ -n "${EC2GPU_SANDBOX_INSTANCE:-}" ]; then  # the system outside $HOME is this machine's, not the instance's
  echo "sandbox instance ${EC2GPU_SANDBOX_INSTANCE}: its system is this machine's; no driver installed"
  exit 0
fi
if driver_answers; then
  echo "NVIDIA driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1) answers: nothing to install"
  exit 0
fi
seen=$(nvidia_gpus)
if [ "$seen" -eq 0 ]; then
  if [ "$expected" -gt 0 ]; then
    echo "${itype:-this instance type} has ${expected} NVIDIA GPU(s) but none is on this machine's PCI bus" \
         "(${pci}): no driver installed, and no image should be made without one" >&2
    exit "$NO_GPU_SEEN"
  fi
  echo "no NVIDIA GPU on this machine (none on its PCI bus) and none expected: no driver installed; torch will use the CPU"
  exit 0
fi
echo "${seen} NVIDIA GPU(s) on the PCI bus${itype:+ of this ${itype}}"

if command -v cloud-init >/dev/null 2>&1; then
  echo "waiting for cloud-init to finish the first boot before apt (${APT_LOCK_TIMEOUT_S} s at most)"
  timeout "$APT_LOCK_TIMEOUT_S" cloud-init status --wait >/dev/null \
    || echo "cloud-init did not report done (see /var/log/cloud-init.log); going on"
fi
apt_conf=$(mktemp)
trap 'rm -f "$apt_conf"' EXIT
printf 'DPkg::Lock::Timeout "%s";\n' "$APT_LOCK_TIMEOUT_S" >"$apt_conf"
apt_get update -qq
apt_get install -y -qq ubuntu-drivers-common
listing=$(ubuntu-drivers list --gpgpu 2>/dev/null || true)
# the newest proprietary server (data centre) branch Ubuntu offers for this GPU
branch=$(printf '%s\n' "$listing" \
         | sed -n -E 's/^[[:space:]]*nvidia-(driver|headless-no-dkms|headless)-([0-9]+)-server(,.*)?[[:space:]]*$/\2/p' \
         | sort -n | tail -n 1)
if [ -z "$branch" ]; then
  echo "ubuntu-drivers offers no server driver for this GPU: install one by hand, or bake --from dlami" >&2
  printf 'ubuntu-drivers list --gpgpu said:\n%s\n' "${listing:-(nothing)}" >&2
  exit 1
fi
echo "installing NVIDIA driver branch ${branch} (server) for ${itype:-this instance}"
as_root env DEBIAN_FRONTEND=noninteractive APT_CONFIG="$apt_conf" ubuntu-drivers install --gpgpu "nvidia:${branch}-server"
apt_get install -y -qq "nvidia-utils-${branch}-server"
case "$itype" in
  p4d.*|p4de.*|p5.*|p5e.*|p5en.*)
    echo "${itype}: NVSwitch system: installing NVIDIA Fabric Manager ${branch}"
    apt_get install -y -qq "nvidia-fabricmanager-${branch}"
    as_root systemctl enable nvidia-fabricmanager ;;
esac

if driver_answers; then
  echo "NVIDIA driver ${branch} loaded without a reboot"
  exit 0
fi
echo "NVIDIA driver ${branch} installed: the instance must reboot before it loads"
exit "$REBOOT_NEEDED"
