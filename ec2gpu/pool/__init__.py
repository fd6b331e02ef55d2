"""Arrays and sweeps over an elastic pool of instances, scheduled by Ray (docs/pool.md).

``attempt`` (the controller side: Ray on each node, the driver on the head, the pool shrunk as the
queue drains, results home), ``records`` (the driver's table.json as hostile input, the element
table), and what is shipped to the instances: ``node`` (one Ray node, stdlib) and ``driver`` (the
Ray driver). The task side (``array:``, ``sweep:``, ``--array``) is ec2gpu/tasks/arrays.py.
"""
