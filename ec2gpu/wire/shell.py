"""How a task's setup and run are started on an instance, in one place: the foreground engine
(runs/execute/engine.py), the pool's driver (pool/attempt.py) and a detached run's agent
(agent/attempt.py) start them with these words. No imports: shipped beside the agent
(runs/detached/launch.WIRE_FILES).
"""

#: How a task's setup and run are started, as SkyPilot starts them, with ~/.bashrc read first
#: (sky/backends/cloud_vm_ray_backend.py ``_setup``: "/bin/bash -i", "to make sure `source
#: ~/.bashrc` work"; sky/skylet/log_lib.py for the run): a setup's `conda init` or its
#: `echo export X=1 >> ~/.bashrc` reaches the run. ``bash -c INTERACTIVE HANDOFF BODY NAME ARGS...``:
#: an interactive bash reads ~/.bashrc (its complaints about having no terminal, "no job control in
#: this shell", go to /dev/null: its stderr is fd 3 until HANDOFF restores it), exports the shell
#: functions ~/.bashrc defined (`conda activate` is one), and hands BODY to a non-interactive bash,
#: $0 NAME and "$@" ARGS: an interactive shell would ignore SIGTERM, say "tcsetattr" where a killed
#: command's "Killed" or "Segmentation fault" belongs, and print "exit" and "[1] PID".
INTERACTIVE = 'exec bash -i -c "$0" "$@" 3>&2 2>/dev/null'
HANDOFF = ('exec 2>&3 3>&-; for _ec2gpu_f in $(compgen -A function); do export -f "$_ec2gpu_f" 2>/dev/null; done; '
           'unset _ec2gpu_f; exec bash -c "$0" "$@"')
#: BODY's start: on SIGTERM (the agent's, for a spot notice or the max runtime) the script ends with
#: 143 once the command it waits for has ended, so a job that checkpoints on SIGTERM has its grace
#: and nothing after it runs; the Python with torch first on PATH again (~/.bashrc may have put
#: another first); in the workdir.
PROLOGUE = ("trap 'exit 143' TERM; "
            'case "${EC2GPU_PYTHON:-}" in */*) export PATH="${EC2GPU_PYTHON%/*}:$PATH";; esac; '
            'cd "${EC2GPU_WORKDIR:-.}" || exit 1\n')
