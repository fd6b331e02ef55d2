"""Test-only entry point: `python pause_in_phase.py PHASE ARGV...` runs the ec2gpu CLI with ARGV,
pausing 60 s at the end of PHASE's work (through pipeline.Reporter.after_phase, a seam the shipped
program leaves unset), so a signal the test sends surely lands in that phase."""
import sys
import time

from ec2gpu import cli
from ec2gpu.runs.provision import pipeline


def main() -> int:
    phase, argv = sys.argv[1], sys.argv[2:]

    def pause(name: str) -> None:
        if name == phase:
            print(f"pausing in phase {name}", file=sys.stderr, flush=True)
            time.sleep(60)
    pipeline.Reporter.after_phase = staticmethod(pause)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
