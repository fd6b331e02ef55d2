"""Detached runs (`ec2gpu run --detach`): runs that AWS and the instance's agent own, not this process.

``launch``: put the run in its S3 store and hand it to an Auto Scaling group, then return.
The instance side is ec2gpu/agent/detached.py; the store's layout is aws/runstore.py.
"""
