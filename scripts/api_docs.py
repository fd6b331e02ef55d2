"""Write docs/api.md from ec2gpu.api: one section per command, its function's signature, its
docstring and an example (issue 29, item 7). tests/unit/test_api_docs.py fails when the file is
not what this script writes, so the page cannot drift from the code.

    .venv/bin/python scripts/api_docs.py            # rewrite docs/api.md
    .venv/bin/python scripts/api_docs.py --check    # exit 1 when docs/api.md is out of date
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"

#: An example per function, run as written against the sandbox (`sandbox=True`: no AWS account).
EXAMPLES = {
    "run": 'record = ec2gpu.run("examples/quickstart/task.yaml", sandbox=True, expect="1m")\n'
           'print(record["status"], record["cost_usd"], record["summary"])',
    "status": 'run = ec2gpu.run("examples/quickstart/task.yaml", sandbox=True, max_runtime="1h", detach=True)\n'
              'print(ec2gpu.status(run["run_id"], sandbox=True)["state"])',
    "cancel": 'done = ec2gpu.cancel("20261125-041200-ab12", sandbox=True)\nprint(done["state"], done["removed"])',
    "exec": 'record = ec2gpu.exec("dev", "examples/quickstart/task.yaml", sandbox=True)',
    "bake": 'record = ec2gpu.bake("examples/quickstart/task.yaml", sandbox=True)\nprint(record["summary"]["image_id"])',
    "train_mnist": 'record = ec2gpu.train_mnist(epochs=1, sandbox=True)\nprint(record["test_acc"])',
    "bench": 'result = ec2gpu.bench(sandbox=True)',
    "launch": 'rows = ec2gpu.launch(name="dev", max_runtime=60, sandbox=True)\nprint(rows[0]["instance_id"])',
    "stop": 'ec2gpu.stop("dev", sandbox=True)',
    "start": 'ec2gpu.start("dev", sandbox=True)',
    "scale": 'done = ec2gpu.scale("team", 3, sandbox=True)\nprint(done["added"])',
    "list_instances": 'for row in ec2gpu.list_instances(sandbox=True):\n'
                      '    print(row["name"], row["state"], row["cost_so_far_usd"])',
    "down": 'removed = ec2gpu.down("dev", sandbox=True)\nassert not any(r.get("left") for r in removed.values())',
    "cleanup": 'report = ec2gpu.cleanup(dry_run=True, sandbox=True)\nprint(report["regions"])',
    "doctor": 'failed = [c["name"] for c in ec2gpu.doctor(sandbox=True) if c["ok"] is False]',
    "ssh": 'status = ec2gpu.ssh("dev", ["nvidia-smi"], sandbox=True)',
    "ssh_config": 'print(ec2gpu.ssh_config(sandbox=True)["path"])',
    "tunnel": 'ec2gpu.tunnel("dev", 6006, sandbox=True)  # until Ctrl-C',
    "notebook": 'ec2gpu.notebook(name="dev", sandbox=True, on_ready=lambda info: print(info["url"]))',
    "logs": 'import sys\nec2gpu.logs("dev", write=lambda chunk, final=False: sys.stdout.buffer.write(chunk), sandbox=True)',
    "fetch": 'got = ec2gpu.fetch("20261125-0412-ab12", sandbox=True)',
    "prices": 'for row in ec2gpu.prices(gpu="L4", sandbox=True)["instance_types"]:\n'
              '    print(row["instance_type"], row["on_demand_usd_per_hour"])',
    "estimate": 'for e in ec2gpu.estimate(["g4dn.xlarge", "g6.xlarge"], spot=True, sandbox=True):\n'
                '    print(e["instance_type"], e["cost_usd"])',
    "list_runs": 'print(ec2gpu.list_runs(since="2w")["total"]["cost_usd"])',
    "show_run": 'print(ec2gpu.show_run("20261125")["status"])',
    "list_images": 'for image in ec2gpu.list_images(sandbox=True):\n    print(image["name"], image["usd_per_month"])',
    "remove_image": 'ec2gpu.remove_image("quickstart-20261125-041200", sandbox=True)',
    "sandbox_up": 'state = ec2gpu.sandbox_up()\nprint(state["endpoint"])',
    "sandbox_down": 'ec2gpu.sandbox_down()',
    "sandbox_status": 'print(ec2gpu.sandbox_status())',
    "sandbox_interrupt": 'ec2gpu.sandbox_interrupt("i-0123456789abcdef0", notice_seconds=30)',
    "sandbox_capacity": 'ec2gpu.sandbox_capacity("g4dn.xlarge", 1)',
    "sandbox_env": 'import os\nos.environ.update(ec2gpu.sandbox_env())',
}


def signature(func) -> str:
    """``func``'s parameters as Python spells them (pure): annotations unquoted (the modules use
    `from __future__ import annotations`), a callable default shown as the no-op it is, never as its
    address (the page must not change from one run to the next)."""
    out, star = [], False
    for p in inspect.signature(func).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        text = p.name
        if p.annotation is not p.empty:
            text += f": {p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)}"
        if p.default is not p.empty:
            default = "lambda text: None" if callable(p.default) else repr(p.default)
            text += f" = {default}" if p.annotation is not p.empty else f"={default}"
        out.append(text)
    ret = inspect.signature(func).return_annotation
    arrow = "" if ret is inspect.Signature.empty else f" -> {ret}"
    return "(" + ", ".join(out) + ")" + arrow


def render() -> str:
    """docs/api.md's text (pure, given the code): the API's module docstring, a table of commands
    and their functions, then per function its signature, docstring and example."""
    from ec2gpu import api
    parts = ["# The Python API\n",
             "<!-- written by scripts/api_docs.py from ec2gpu/api/; do not edit: run the script -->\n",
             inspect.cleandoc(api.__doc__ or "") + "\n",
             "| command | function |\n|---|---|"]
    parts += [f"| `ec2gpu {cmd}` | [`ec2gpu.{fn}`](#{fn}) |" for cmd, fn in api.COMMANDS.items()]
    parts.append("")
    for cmd, fn in api.COMMANDS.items():
        func = getattr(api, fn)
        sig = signature(func)
        parts += [f"## {fn}\n", f"`ec2gpu {cmd}`, from `{func.__module__}`\n",
                  f"```python\nec2gpu.{fn}{sig}\n```\n", inspect.cleandoc(func.__doc__ or "(no docstring)") + "\n",
                  f"```python\nimport ec2gpu\n{EXAMPLES[fn]}\n```\n"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) docs/api.md; exit 1 when --check finds it out of date."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="Only say whether docs/api.md is up to date.")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        same = DOC.exists() and DOC.read_text() == text
        print("docs/api.md is up to date" if same else "docs/api.md is out of date: run scripts/api_docs.py")
        return 0 if same else 1
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
