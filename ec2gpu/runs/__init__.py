"""Runs: the pipeline that does a whole job, and what it costs."""
