"""The instance side of `ec2gpu run`: agent.py, shipped with every job (standard library only)."""
