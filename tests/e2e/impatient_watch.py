"""Test-only entry point: `python impatient_watch.py N ARGV...` runs the ec2gpu CLI with ARGV, its
instance watch giving up after N failed DescribeInstances in a row instead of
recovery.MAX_API_FAILURES (12), and botocore trying each call twice instead of session.RETRIES'
8 (with backoff), so a lost AWS endpoint ends the run in seconds instead of about 100 s."""
import sys

from ec2gpu import cli
from ec2gpu.aws import session
from ec2gpu.runs.recover import recovery


def main() -> int:
    recovery.MAX_API_FAILURES = int(sys.argv[1])
    session.RETRIES = {"mode": "standard", "total_max_attempts": 2}
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
