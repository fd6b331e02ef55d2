"""Runs: everything that does a job on instances, in the order of a run's life.

- ``plan/``: before it (dry run, limits, the estimate, doctor);
- ``launch/``: a whole run on new instances (the pipeline, what it provisions; bench and image bake);
- ``execute/``: one attempt (nodes, the engine and the agent's status, the job summary, logs, local runs);
- ``recover/``: spot recovery, and runs whose controller died;
- ``settle/``: the run record, the ledger and the bill;
- ``standing/``: jobs on, and stop/start of, instances made by ``ec2gpu launch``; the notebook.

Nothing here calls boto3 or fabric itself: AWS calls live in ``aws/``, SSH and files in ``remote/``."""
