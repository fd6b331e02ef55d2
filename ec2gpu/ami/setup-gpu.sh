#!/usr/bin/env bash
# Make an instance ready to train: report the GPU and driver, find (or install) a Python with
# torch, and write what was found to a JSON file the controller reads.
# Idempotent: a second run finds what the first one made and changes nothing.
# Usage: setup-gpu.sh [OUT_JSON]      (default ./setup.json)
set -euo pipefail
out=${1:-setup.json}
venv="$HOME/.ec2gpu-venv"

gpu_name=""; driver=""; gpu_count=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
  gpu_count=$(nvidia-smi -L | wc -l)
  echo "GPU: ${gpu_count} x ${gpu_name}, NVIDIA driver ${driver}"
else
  # said of every job (a task may train nothing); the built-in trainer says its own device
  echo "no NVIDIA GPU found (nvidia-smi missing or failing): the job will see no GPU"
fi

# A baked image (`ec2gpu image bake`) holds what setup found when the image was made: its Python is
# trusted without importing torch (seconds); only this instance's GPUs are read again (the image
# may have been baked on another instance type).
baked="$HOME/.ec2gpu/baked-setup.json"
if [ -f "$baked" ]; then
  bpy=$(sed -n 's/^ *"python": "\(.*\)",*$/\1/p' "$baked")
  if [ -n "$bpy" ] && [ -x "$bpy" ]; then
    "$bpy" - "$baked" "$out" "$gpu_name" "$driver" "$gpu_count" <<'PY'
import json, sys
baked, out, gpu_name, driver, count = sys.argv[1:]
info = json.load(open(baked))
info.update(gpu_name=gpu_name or None, driver_version=driver or None, gpu_count=int(count),
            cuda_available=bool(info.get("cuda_version")) and int(count) > 0, baked=True)
with open(out, "w") as f:
    json.dump(info, f, indent=2)
print(f"baked image: python {info['python']}, torch {info['torch_version']} (checked when the image was made)")
PY
    exit 0
  fi
  echo "baked setup names a Python that is not there ($bpy): setting up as usual"
fi

has_torch() { "$1" -c 'import torch, numpy' >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
python=""
# EC2GPU_PYTHON, then the Deep Learning AMI's PyTorch environment (/opt/pytorch/bin/python on the
# Ubuntu 24.04 DLAMIs, python3 beside it on older ones, conda on the oldest), python3 on PATH, ours.
for cand in "${EC2GPU_PYTHON:-}" /opt/pytorch/bin/python /opt/pytorch/bin/python3 /opt/conda/envs/pytorch/bin/python3 \
            "$(command -v python3 || true)" "$venv/bin/python3"; do
  if [ -n "$cand" ] && [ -x "$cand" ] && has_torch "$cand"; then python=$cand; break; fi
done
if [ -z "$python" ]; then
  echo "no Python with torch found: creating $venv and installing torch (takes a few minutes)"
  if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    # Debian and Ubuntu ship venv's pip bootstrap separately: `python3 -m venv` fails without it
    echo "python3-venv is missing: installing it with apt-get"
    # a fresh Ubuntu's first boot runs unattended-upgrades, which holds the dpkg lock for minutes:
    # let cloud-init finish (600 s at most), and wait up to 600 s for the lock (apt.conf(5),
    # DPkg::Lock::Timeout)
    if command -v cloud-init >/dev/null 2>&1 && [ -z "${EC2GPU_SANDBOX_INSTANCE:-}" ]; then
      timeout 600 cloud-init status --wait >/dev/null || true
    fi
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv
  fi
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch numpy matplotlib
  python="$venv/bin/python3"
fi

"$python" - "$out" "$gpu_name" "$driver" "$gpu_count" <<'PY'
import json, sys
import torch
out, gpu_name, driver, count = sys.argv[1:]
info = {"python": sys.executable, "torch_version": torch.__version__,
        "cuda_available": torch.cuda.is_available(), "cuda_version": torch.version.cuda,
        "gpu_name": gpu_name or None, "driver_version": driver or None, "gpu_count": int(count)}
with open(out, "w") as f:
    json.dump(info, f, indent=2)
print(f"python {sys.executable}: torch {torch.__version__}, CUDA available: {info['cuda_available']}")
PY
