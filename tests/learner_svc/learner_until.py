"""The deployed learner (``python -m learner_svc``'s swarm loop, configured from the same
environment variables) run until N trajectories are trained, with optional fault injection:
``python learner_until.py N [K]`` SIGKILLs the process right after its K-th checkpoint, before
that checkpoint's offsets are committed. Used by test_crash_kafka.py as a real process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from learner_svc.__main__ import swarm_loop
from learner_svc.config import LearnerConfig
from podium.bus import connect
from podium.config import from_env


async def main(until_trained: int, kill_after: int | None) -> int:
    config = from_env(LearnerConfig)
    bus = connect(config.bus_url)
    await bus.start()
    try:
        loop = swarm_loop(config, bus)
        checkpoints = 0

        def after_checkpoint(step: int) -> None:
            nonlocal checkpoints
            checkpoints += 1
            if kill_after is not None and checkpoints >= kill_after:
                logging.shutdown()
                os.kill(os.getpid(), signal.SIGKILL)

        loop.after_checkpoint = after_checkpoint
        state = await loop.run(until_trained=until_trained)
    finally:
        await bus.stop()
    print(f"trained {state.trained} skipped_redelivered {state.skipped_redelivered}", flush=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    kill = int(sys.argv[2]) if len(sys.argv) > 2 else None
    raise SystemExit(asyncio.run(main(int(sys.argv[1]), kill)))
