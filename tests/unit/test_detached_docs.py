"""What README.md, docs/detached.md and docs/commands.md say of a detached run's limit is what runs/detached/launch.py
does: `--max-runtime` is not required (the limit is picked as for any run, runs/plan/limits.py);
only `--max-runtime none` is refused, as nothing else would end the run."""
import re
from pathlib import Path

import pytest

from ec2gpu.errors import UsageError
from ec2gpu.runs.detached import launch
from ec2gpu.runs.options import RunOptions
from ec2gpu.runs.plan import limits
from ec2gpu.runs.execute import engine
from ec2gpu.tasks import load

ROOT = Path(__file__).resolve().parents[2]


def _detached_part(path):
    """``path``'s text, its lines joined (README.md links to docs/detached.md, which has it all)."""
    return " ".join((ROOT / path).read_text().split())


def test_the_docs_never_call_max_runtime_required_for_a_detached_run_and_name_none_refused(tmp_path):
    job = engine.TaskJob(load.parse("name: mine\nrun: python train.py\n"), {}, None)
    picked = limits.for_task(tmp_path, "mine", "sandbox", None, None)  # no --max-runtime, no max_runtime
    assert picked.minutes == limits.FIRST_RUN_MINUTES
    assert launch.check(RunOptions(task=job, max_runtime_minutes=picked.minutes)).name == "mine"
    with pytest.raises(UsageError, match="needs a limit"):
        launch.check(RunOptions(task=job, max_runtime_minutes=None))  # what `--max-runtime none` gives
    for path in ("README.md", "docs/detached.md", "docs/commands.md"):
        said = _detached_part(path)
        assert not re.search(r"`--max-runtime`[^.;]{0,40}\b(required|needed|needs)\b", said), path
    assert "`--max-runtime none` is refused" in _detached_part("docs/detached.md")
