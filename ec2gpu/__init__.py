"""ec2gpu: rent a GPU on AWS EC2 for exactly as long as a job needs it.

The Python API is ``ec2gpu.run(...)``, ``ec2gpu.exec(...)`` and ``ec2gpu.bake(...)`` (ec2gpu/api.py), imported on first
use, so `import ec2gpu` stays light (this file also travels to instances with the trainer).
"""

__version__ = "0.1.0"
__all__ = ["run", "exec", "bake"]


def __getattr__(name):
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'ec2gpu' has no attribute {name!r}")
