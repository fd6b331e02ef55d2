"""The tools a task's setup or run calls that SkyPilot's images have and the Deep Learning AMI has
not: ``uv`` and ``conda``. SkyPilot installs both on every node before a task's setup
(sky/skylet/constants.py: ``SKY_UV_INSTALL_CMD``, uv in ~/.local/bin; ``CONDA_INSTALLATION_COMMANDS``,
conda initialised in ~/.bashrc), and SkyPilot task files call them (`uv pip install`, `conda
activate`); the Ubuntu 24.04 PyTorch DLAMI has neither (its PyTorch is a venv in /opt/pytorch).

A task that calls one (``needed``: the word as a command in its setup or run) gets it: ``with_tools``
puts the lines that install it on first use (``install_lines``) before the task's own setup, so every
mode that runs the setup (a run, an array's workers, `exec`, a bake, a detached run's agent) runs them
the same way. They install nothing where the tool is already there: on a standing instance after the
first setup, and on an image baked from the task (the tools are in its home, baked with it).

- uv: from PyPI (``pip install --target``, with the Python setup found: the sandbox's instances and a
  private subnet with a PyPI mirror reach it), else Astral's installer as SkyPilot runs it; into
  ~/.local/bin, on PATH for the setup and, through ~/.bashrc, for the run (its ``bash -i`` reads it:
  wire/shell.py).
- conda: Miniforge (conda-forge's installer: no Anaconda terms of service) from its GitHub release,
  checked against the sha256 published beside it, into ~/miniforge3; ``conda init bash`` so the run
  has ``conda activate``, the base environment not activated (the Python with torch stays first).
"""
from __future__ import annotations

import re

#: each tool, by the words that call it: uvx is uv's; mamba comes with Miniforge
CALLS = {"uv": ("uv", "uvx"), "conda": ("conda", "mamba")}
#: a word as a command or argument, not inside a path, a file name or another word
#: (`/opt/conda/bin/python`, `uv.lock`, `conda-forge` and `$UV_CACHE` are not calls)
_WORD = r"(?<![\w./$-]){}(?![\w./-])"
#: Miniforge's installer, the latest release for this machine's architecture, and its sha256 beside it
#: (https://github.com/conda-forge/miniforge#download)
MINIFORGE_URL = "https://github.com/conda-forge/miniforge/releases/latest/download/Miniforge3-Linux-$(uname -m).sh"
#: Astral's installer, as SkyPilot runs it (sky/skylet/constants.py SKY_UV_INSTALL_CMD)
UV_INSTALLER_URL = "https://astral.sh/uv/install.sh"

_UV = f"""\
# ec2gpu: uv, as SkyPilot's images have it (tasks/tools.py): installed once, in ~/.local/bin
if ! command -v uv >/dev/null 2>&1 && [ ! -x "$HOME/.local/bin/uv" ]; then
  echo "ec2gpu: installing uv into ~/.local/bin"
  mkdir -p "$HOME/.local/bin" "$HOME/.local/share"
  if "${{EC2GPU_PYTHON:-python3}}" -m pip install --quiet --disable-pip-version-check \\
      --target "$HOME/.local/share/ec2gpu-uv" uv && [ -x "$HOME/.local/share/ec2gpu-uv/bin/uv" ]; then
    ln -sf "$HOME/.local/share/ec2gpu-uv/bin/uv" "$HOME/.local/share/ec2gpu-uv/bin/uvx" "$HOME/.local/bin/"
  else
    curl -LsSf {UV_INSTALLER_URL} | env UV_INSTALL_DIR="$HOME/.local/bin" INSTALLER_NO_MODIFY_PATH=1 sh || exit 1
  fi
fi
case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *) export PATH="$PATH:$HOME/.local/bin";; esac
grep -qs 'ec2gpu: ~/.local/bin' "$HOME/.bashrc" \\
  || echo 'export PATH="$PATH:$HOME/.local/bin"  # ec2gpu: ~/.local/bin' >> "$HOME/.bashrc"  # for the run's bash -i
"""

_CONDA = f"""\
# ec2gpu: conda, as SkyPilot's images have it (tasks/tools.py): Miniforge, installed once, in ~/miniforge3
if ! command -v conda >/dev/null 2>&1 && [ ! -x "$HOME/miniforge3/bin/conda" ]; then
  echo "ec2gpu: installing conda (Miniforge) into ~/miniforge3"
  _ec2gpu_d=$(mktemp -d) || exit 1
  curl -fsSL -o "$_ec2gpu_d/Miniforge3.sh" "{MINIFORGE_URL}" \\
    && curl -fsSL -o "$_ec2gpu_d/Miniforge3.sh.sha256" "{MINIFORGE_URL}.sha256" \\
    && [ "$(sha256sum < "$_ec2gpu_d/Miniforge3.sh" | cut -d' ' -f1)" = "$(cut -d' ' -f1 < "$_ec2gpu_d/Miniforge3.sh.sha256")" ] \\
    && bash "$_ec2gpu_d/Miniforge3.sh" -b -p "$HOME/miniforge3" || {{ echo "ec2gpu: conda could not be installed"; exit 1; }}
  rm -rf "$_ec2gpu_d"; unset _ec2gpu_d
  "$HOME/miniforge3/bin/conda" config --set auto_activate_base false
fi
_ec2gpu_conda=$(type -P conda || echo "$HOME/miniforge3/bin/conda")
# `conda activate` in the run (its bash -i reads ~/.bashrc: wire/shell.py), then in this setup
grep -qs '>>> conda initialize >>>' "$HOME/.bashrc" || "$_ec2gpu_conda" init bash >/dev/null
[ "$(type -t conda)" = function ] || eval "$("$_ec2gpu_conda" shell.bash hook)"
unset _ec2gpu_conda
"""

INSTALLERS = {"uv": _UV, "conda": _CONDA}
#: where each comes from and goes, in the plan's words (runs/plan/dryrun.py)
WHERE = {"uv": "uv from PyPI (else astral.sh) into ~/.local/bin",
         "conda": "conda from Miniforge's GitHub release, its sha256 checked, into ~/miniforge3"}


def needed(*texts: str | None) -> tuple[str, ...]:
    """The tools of CALLS (in CALLS' order) that any of ``texts`` (a task's setup and run) calls (pure)."""
    text = "\n".join(t for t in texts if t)
    return tuple(tool for tool, words in CALLS.items()
                 if any(re.search(_WORD.format(re.escape(w)), text) for w in words))


def install_lines(tools: tuple[str, ...]) -> str:
    """The bash lines that install ``tools`` on first use (INSTALLERS; "" for none), each ending in a
    newline: they exit 1 when a tool cannot be installed, so the setup fails saying why."""
    return "".join(INSTALLERS[t] for t in tools)


def with_tools(setup: str | None, run: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(the setup a task runs, the tools it gets) for a task whose setup is ``setup`` and run ``run``
    (pure): ``install_lines`` of the tools it calls before its own setup; ``setup`` itself when it
    calls none, or begins with them already (applied twice, the same)."""
    tools = needed(setup, run)
    lines = install_lines(tools)
    if not tools or (setup or "").startswith(lines):  # none, or put there already (the lines call no other tool)
        return setup, tools
    return lines + (setup or ""), tools


def own_setup(setup: str | None, tools: tuple[str, ...]) -> str | None:
    """The setup as the task file wrote it (pure): ``setup`` less the install lines ``with_tools`` put
    before it, for what is shown to the user."""
    lines = install_lines(tools)
    if lines and setup and setup.startswith(lines):
        return setup[len(lines):] or None
    return setup
