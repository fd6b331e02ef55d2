"""`python -m ec2gpu` is the `ec2gpu` command."""
from .cli import run

run()
