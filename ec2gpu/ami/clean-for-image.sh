#!/usr/bin/env bash
# Remove from a builder instance what must not go into a machine image, before CreateImage
# (AWS, "Best practices for building shared AMIs":
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/building-shared-amis.html):
# authorized keys and private keys, shell histories, AWS credentials, the tool's run directories
# (a job's environment file holds its secrets), and logs. What setup made stays: the Python
# environment, caches and downloads, the setup markers ($HOME/.ec2gpu/setup-done) and the workdir.
# `cloud-init clean --logs` makes an instance from the image run cloud-init afresh: new SSH host
# keys, their fingerprints on its console, the new instance's key pair in authorized_keys. The
# builder's own --max-runtime per-boot script (runs/provision/bake.py, after a driver reboot) goes too.
#
# On a sandbox instance (EC2GPU_SANDBOX_INSTANCE is set) the system outside $HOME is this machine's,
# so only $HOME is cleaned there.
# Usage: clean-for-image.sh      Exit status 0, or 1 when something that must go is still there.
set -euo pipefail
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

homes=("$HOME")
if [ -z "${EC2GPU_SANDBOX_INSTANCE:-}" ]; then
  homes+=(/root)
fi
for h in "${homes[@]}"; do
  as_root rm -rf "$h/ec2gpu/runs" "$h/.aws" "$h/.bash_history" "$h/.python_history" "$h/.lesshst" \
    "$h/.viminfo" "$h/.wget-hsts" "$h/.ssh/authorized_keys"
  # private keys: any id_* under .ssh that is not a public key
  as_root find "$h/.ssh" -maxdepth 1 -type f -name 'id_*' ! -name '*.pub' -delete 2>/dev/null || true
done
per_boot=/var/lib/cloud/scripts/per-boot/ec2gpu-max-runtime.sh
if [ -z "${EC2GPU_SANDBOX_INSTANCE:-}" ]; then
  as_root rm -f "$per_boot"
  as_root find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
  as_root find /var/log -type f -exec truncate -s 0 {} +
  if command -v journalctl >/dev/null 2>&1; then as_root journalctl --rotate --vacuum-time=1s -q || true; fi
  if command -v cloud-init >/dev/null 2>&1; then as_root cloud-init clean --logs; fi
fi

left=()
for h in "${homes[@]}"; do
  for p in "$h/ec2gpu/runs" "$h/.aws" "$h/.bash_history" "$h/.ssh/authorized_keys"; do
    if as_root test -e "$p"; then left+=("$p"); fi
  done
done
if [ -z "${EC2GPU_SANDBOX_INSTANCE:-}" ] && as_root test -e "$per_boot"; then left+=("$per_boot"); fi
if [ "${#left[@]}" -gt 0 ]; then
  echo "still there after cleaning: ${left[*]}" >&2
  exit 1
fi
sync
echo "cleaned for the image: keys, histories, AWS credentials, run directories${EC2GPU_SANDBOX_INSTANCE:+ (sandbox: \$HOME only)}"
