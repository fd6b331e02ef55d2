"""ec2gpu: rent a GPU on AWS EC2 for exactly as long as a job needs it.

The Python API is one function per command: ``ec2gpu.run(...)``, ``ec2gpu.launch(...)``,
``ec2gpu.list_runs(...)``... (ec2gpu/api/, docs/api.md), imported on first use, so `import ec2gpu`
stays light (this file also travels to instances with the trainer).
"""

from types import ModuleType
from typing import Any

__version__ = "0.1.0"


def _api() -> ModuleType:
    """ec2gpu.api, imported now (importlib: `from . import api` would ask this module's __getattr__ first)."""
    import importlib
    return importlib.import_module(__name__ + ".api")


def __getattr__(name: str) -> Any:  # Any: whichever API function or class ``name`` is
    if not name.startswith("_") and name not in ("api", "cli", "runs", "aws", "remote", "tasks", "sandbox", "train"):
        try:
            api = _api()
        except ImportError:  # on an instance only ec2gpu/__init__.py and train/ travel: no API there
            api = None
        if api is not None and name in api.__all__:
            return getattr(api, name)
    raise AttributeError(f"module 'ec2gpu' has no attribute {name!r}")


def __dir__() -> list[str]:
    try:
        names = set(_api().__all__)
    except ImportError:  # as in __getattr__
        names = set()
    return sorted(set(globals()) | names)
