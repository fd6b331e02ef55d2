#!/usr/bin/env bash
# Run tests/unit against the lowest version of every dependency pyproject.toml allows: a throwaway
# venv in /tmp, each `name>=LOWER` of [project] dependencies and the extras turned into a pip
# constraint `name==LOWER`, and torch==2.13.0 (the trainer's torch: a CPU build on these machines'
# disk; torch 2.1 would be GBs of CUDA). Not part of `make test`: it downloads old releases and
# takes minutes. A failure means a lower bound is too low: raise it in pyproject.toml.
#
#   scripts/check_lower_bounds.sh [PYTEST ARGS]   # PYTHON=python3.11 picks the interpreter; KEEP=1 keeps the venv
# With KEEP=1 the venv can run more than tests/unit: tests/aws, tests/remote, tests/train, tests/e2e.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=$(mktemp -d /tmp/ec2gpu-lower-bounds.XXXXXX)
if [ "${KEEP:-0}" = 1 ]; then echo "venv: $VENV (kept)"; else trap 'rm -rf "$VENV"' EXIT; fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" - pyproject.toml >"$VENV/constraints.txt" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
requirements = project["dependencies"] + [r for reqs in project["optional-dependencies"].values() for r in reqs]
for req in requirements:
    name, spec = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(.*)", req).groups()
    lower = re.search(r">=\s*([0-9][0-9.]*)", spec)
    if lower and name.lower() != "torch":
        print(f"{name}=={lower.group(1)}")
print("torch==2.13.0")
EOF
echo "constraints:"; sed 's/^/  /' "$VENV/constraints.txt"

# every extra, as `make install` (torch first, as there)
"$VENV/bin/pip" install -q -c "$VENV/constraints.txt" "torch==2.13.0"
"$VENV/bin/pip" install -q -c "$VENV/constraints.txt" -e ".[train,sandbox,notebook,pool,dev]"
echo "installed:"; "$VENV/bin/pip" freeze --exclude-editable | grep -iE "^($(sed 's/==.*//' "$VENV/constraints.txt" | paste -sd'|'))==" | sed 's/^/  /'

"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/unit "$@"
