"""One attempt of a job: the nodes, the engine that starts the agent on each and watches its
signed status record, the job's summary, `ec2gpu logs`, the local run (`train mnist --local`),
and what a run tells the user (the reporter)."""
