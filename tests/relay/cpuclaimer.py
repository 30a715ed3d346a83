"""A process that relays nothing but holds its CPU as a relay does (relay/affinity.py), for the tests
of CPU claims between processes:

    python -m tests.relay.cpuclaimer START ALLOWED   # e.g. 0 0,1

It starts on CPU START (as two processes started together may both be placed), may then run on the
CPUs ALLOWED, enters `relay_cpu(True)` and prints one JSON line, `{"cpu": ..., "cpus": [...]}` (the
CPU it holds, None if none, and the CPUs its threads may use then); it holds them until its stdin
closes, or until it is killed.
"""

from __future__ import annotations

import json
import os
import sys

from bulkrelay.relay.affinity import relay_cpu


def main(start: int, allowed: set[int]) -> None:
    os.sched_setaffinity(0, {start})
    os.sched_setaffinity(0, allowed)  # still on START: nothing moves a thread without a reason
    with relay_cpu(True) as cpu:
        print(json.dumps({"cpu": cpu, "cpus": sorted(os.sched_getaffinity(0))}), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(int(sys.argv[1]), {int(each) for each in sys.argv[2].split(",")})
