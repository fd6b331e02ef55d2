"""A whole run on new instances: the pipeline (estimate -> provision -> attempts -> teardown ->
bill -> ledger), what a run creates on AWS (provision), and the runs built on it: `ec2gpu bench`
and `ec2gpu image bake`."""
