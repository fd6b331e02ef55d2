"""Built-in tasks: ordinary task files shipped in the package (mnist.yaml: `ec2gpu train mnist`; bench.yaml: `ec2gpu bench`)."""
from __future__ import annotations

from importlib import resources

from ..load import LoadedTask, parse

NAMES = ("mnist", "bench")


def load(name: str) -> LoadedTask:
    """The built-in task ``name`` (one of NAMES), validated like any task file.

    Raises KeyError for an unknown name (a programming error: the CLI offers only NAMES).
    """
    if name not in NAMES:
        raise KeyError(name)
    text = (resources.files(__package__) / f"{name}.yaml").read_text()
    return parse(text, f"<built-in task {name}>")
