"""What a learner announces when it starts: a learner that follows the rollout (a deployment)
does not announce its starting weights (version 0: trained on nothing, never exported, and a
candidate the controller would propose), so orchestrators on a served backend log no refusal
at a normal start; ``podium train``'s learner (no rollout) still announces version 0 to its
actor (tests/learner_svc/test_swarm_export.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from learner_svc.algorithms.swarm import SwarmPPO, SwarmSettings
from learner_svc.loop import LearningLoop, LoopConfig
from podium import topics
from podium.bus import InProcBus
from podium.policy.signing import ensure_key_pair
from podium.policy.swarm import MODEL_NAME


def _loop(tmp_path: Path, bus: InProcBus, rollout_topic: str) -> LearningLoop:  # type: ignore[type-arg]
    settings = SwarmSettings(
        artifacts_dir=str(tmp_path / "artifacts"),
        model_repository=str(tmp_path / "models"),
        signing_key=str(ensure_key_pair(tmp_path / "keys").private_path),
    )
    config = LoopConfig(
        checkpoint_dir=tmp_path / "ckpt",
        group_id="sa.learner",
        batch_trajectories=4,
        rollout_topic=rollout_topic,
    )
    return LearningLoop(config, SwarmPPO.from_settings(settings), bus)


async def _announced_at_start(tmp_path: Path, rollout_topic: str) -> list[str]:
    bus = InProcBus()
    await bus.start()
    watch = bus.subscriber([topics.POLICY_UPDATES], "sa.watch")
    await watch.start()
    try:
        loop = _loop(tmp_path, bus, rollout_topic)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop=stop))
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 30)
        return [(r.key or b"").decode() for r in await watch.fetch(10, 0.5)]
    finally:
        await bus.stop()


async def test_a_learner_following_the_rollout_does_not_announce_version_0(
    tmp_path: Path,
) -> None:
    assert await _announced_at_start(tmp_path / "deployed", topics.ROLLOUT) == []
    assert not (tmp_path / "deployed" / "models" / MODEL_NAME / "0").exists()
    # Without a rollout (podium train) version 0 is the actor's first policy: announced.
    assert await _announced_at_start(tmp_path / "train", "") == [MODEL_NAME]
