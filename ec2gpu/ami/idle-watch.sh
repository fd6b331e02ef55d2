#!/bin/bash
# ec2gpu's idle rule, enforced by the instance itself (so it holds with the laptop closed).
#
#   idle-watch.sh IDLE_SECONDS [CHECK_SECONDS]
#
# Every CHECK_SECONDS (default 30) it asks whether the instance is busy:
#   - a job: the record of ec2gpu's agent (agent-record.json) says "running" (or its handover is "pending": the job
#     ended, its controller has not collected it yet) and that agent process lives;
#   - an SSH connection: an established TCP connection to sshd's port (a shell, a tunnel, an
#     editor's remote session, the controller following a job);
#   - a GPU: nvidia-smi reports 5% utilisation or more on any GPU (no nvidia-smi: no GPU busy).
# After IDLE_SECONDS without any of them it runs `shutdown -h now`: EC2 then stops the instance
# (--idle-stop: InstanceInitiatedShutdownBehavior=stop) or terminates it (--idle-down: terminate).
# Each change between busy and idle is one line on the console (EC2GPU_CONSOLE, default
# /dev/console, which GetConsoleOutput returns), so `ec2gpu ls` reads how long it has been idle
# through the EC2 API: an SSH connection to ask would itself make the instance busy. One line per
# change, not per check: the console keeps only its last 64 KB, and cloud-init's host key
# fingerprints are in it.
#
# Installed and started by the instance's user data (aws/instances.py: user_data): a systemd
# service on an instance (it comes back after a stop and start), in the background where ec2gpu's
# sandbox stands in for the instance (EC2GPU_STATE_DIR set; no systemd of the instance's own).
# In the sandbox, EC2GPU_SSH_ADDRESS and EC2GPU_SSH_PORT name the instance's own sshd among the
# machine's others; on an instance sshd listens on port 22.
set -u

idle_s=${1:?usage: idle-watch.sh IDLE_SECONDS [CHECK_SECONDS]}
check_s=${2:-30}
ssh_port=${EC2GPU_SSH_PORT:-22}
ssh_address=${EC2GPU_SSH_ADDRESS:-}
console=${EC2GPU_CONSOLE:-/dev/console}
gpu_busy_percent=5

job_running() {
  local f pid
  for f in "${HOME:-/root}"/ec2gpu/runs/*/agent-record.json /home/*/ec2gpu/runs/*/agent-record.json; do
    [ -f "$f" ] || continue
    grep -q -e '"state": "running"' -e '"handover": "pending"' "$f" || continue
    pid=$(sed -n 's/.*"agent_pid": \([0-9][0-9]*\).*/\1/p' "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      return 0
    fi
  done
  return 1
}

ssh_connected() {
  local filter="sport = :$ssh_port"
  if [ -n "$ssh_address" ]; then
    filter="$filter and src $ssh_address"
  fi
  [ -n "$(ss -Htn state established "( $filter )" 2>/dev/null)" ]
}

gpu_busy() {
  command -v nvidia-smi >/dev/null 2>&1 || return 1
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null |
    awk -v t="$gpu_busy_percent" '$1 + 0 >= t { busy = 1 } END { exit !busy }'
}

say() {
  echo "ec2gpu-idle: $* rule $idle_s" >>"$console" 2>/dev/null || true
}

last_busy=$(date +%s)
said=""
while :; do
  now=$(date +%s)
  why=""
  if job_running; then
    why=job
  elif ssh_connected; then
    why=ssh
  elif gpu_busy; then
    why=gpu
  fi
  if [ -n "$why" ]; then
    last_busy=$now
    [ "$said" = "busy $why" ] || say "busy $why since $now"
    said="busy $why"
  elif [ "$said" != idle ]; then
    say "idle since $last_busy"
    said=idle
  fi
  idle=$((now - last_busy))
  if [ "$idle" -ge "$idle_s" ]; then
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) idle for $idle s (rule: $idle_s s): shutting down"
    shutdown -h now "ec2gpu: idle for $idle s"
    exit 0
  fi
  sleep "$check_s"
done
