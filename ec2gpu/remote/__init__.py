"""The remote layer: the only package that imports fabric/paramiko."""
