"""Swarm environment throughput: steps/s on one core for 30-subtask tasks, random valid policy.

Run: ``python bench/swarm_env_speed.py [--seconds 5] [--json OUT]`` (same as
``podium bench env``). Prints steps per CPU-second against the 20,000 steps/s target and
exits 1 below it. Single-threaded by construction; CPU time (not wall time) is the measure,
so other processes on the machine do not distort it.
"""

from __future__ import annotations

import sys

from podium_app.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "env", *sys.argv[1:]]))
