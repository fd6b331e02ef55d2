"""Before a run: its plan (`run --dry-run`), its instance-side limit (`--max-runtime`), its cost
estimate, and `ec2gpu doctor`'s checks. Nothing here creates anything on AWS."""
