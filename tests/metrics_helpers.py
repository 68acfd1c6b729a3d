"""Scraping a Podium ``/metrics`` endpoint, and real work that moves every Podium metric.

:func:`scrape` reads an endpoint with ``prometheus_client``'s own text parser (what Prometheus
accepts is what is asserted). :func:`exercise_every_metric` runs the services' real code on
the in-process bus: the embedded demo (all four services, one session over gRPC), a consumer
fed poison (dead letters, lag), the reward service scoring a trajectory that abuses tools (a
detector fires) and the learning loop training two batches (samples, policy lag).
"""

from __future__ import annotations

import asyncio
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent / "learner_svc"))  # loop_helpers

from loop_helpers import N_ACTIONS, OBS_DIM, behaviour_policy, publish_trajectories

from learner_svc.algorithms.ppo import GenericPPO, GenericPPOConfig
from learner_svc.loop import LearningLoop, LoopConfig
from podium import codec, topics
from podium.bus import InProcBus
from podium.bus.base import TopicSpec
from podium.bus.consumer import EventConsumer
from podium.envs.swarm.spec import default_tasks_dir
from podium.policy.signing import ensure_key_pair
from podium.rewards import default_config
from podium.rewards.examples import tool_abuse
from podium.v1 import reward_pb2
from podium_app.commands.demo import DEFAULT_TASK, DemoReport, run_demo
from reward_svc.app import RewardApp
from reward_svc.config import RewardServiceConfig

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name (``podium_sessions_total``, ``..._bucket``) -> (labels, value) of each series."""


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    """Every sample of ``http://host:port/metrics``, parsed by ``prometheus_client``."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode("utf-8")
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the ``name`` series whose labels include ``labels`` (0 when there is none)."""
    return sum(
        v for got, v in samples.get(name, []) if all(got.get(k) == w for k, w in labels.items())
    )


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    """The values ``label`` takes among the ``name`` series."""
    return {got[label] for got, _ in samples.get(name, []) if label in got}


@dataclass
class Work:
    """What :func:`exercise_every_metric` did, for the assertions."""

    demo: DemoReport | None = None
    lag_after_first_fetch: int = 0
    poison_topic: str = ""
    poison_group: str = ""
    poison_records: int = 0
    fired: list[str] = field(default_factory=list)
    """Detectors that charged a penalty on the tool abuser's scored trajectory."""
    abuse: reward_pb2.ScoredTrajectory | None = None
    """The tool abuser's scored trajectory."""
    trained: int = 0


async def poison_consumer(work: Work) -> None:
    """A consumer group fed three undecodable records, one per fetch: it lags 2 behind after
    the first and dead-letters all three."""
    bus = InProcBus()
    await bus.start()
    work.poison_topic, work.poison_group, work.poison_records = "metrics.poison", "metrics-g", 3
    try:
        await bus.create_topics([TopicSpec(work.poison_topic, 1)])
        for k in range(work.poison_records):
            await bus.publish(work.poison_topic, b"not an envelope", key=f"k{k}")

        async def never(*_: object) -> None:
            raise AssertionError("an undecodable record reached the handler")

        consumer = EventConsumer(
            bus, [work.poison_topic], work.poison_group, never, producer_name="m", max_batch=1
        )
        await consumer.start()
        try:
            await consumer.run_once()
            work.lag_after_first_fetch = sum((await consumer.subscriber.lag()).values())
            while await consumer.run_once():
                pass
        finally:
            await consumer.stop()
        assert consumer.stats.dead_lettered == work.poison_records
    finally:
        await bus.stop()


async def score_tool_abuse(work: Work) -> None:
    """The reward service scores a trajectory that abuses tools; the detectors that fired."""
    bus = InProcBus()
    await bus.start()
    app = RewardApp(
        RewardServiceConfig(bus_url="inproc://", instance="reward-metrics"), default_config(), bus
    )
    await app.start()
    try:
        _, data = codec.encode_event(tool_abuse(), producer="test", key="s1")
        await bus.publish(topics.TRAJECTORIES, data, key="s1")
        reader = bus.subscriber([topics.SCORED_TRAJECTORIES], "metrics-reader")
        await reader.start()
        records = []
        for _ in range(100):
            records += await reader.fetch(10, 0.1)
            if records:
                break
        await reader.stop()
        assert records, "the reward service scored nothing"
        _, scored = codec.decode_event(records[0].value, reward_pb2.ScoredTrajectory)
        work.abuse = scored
        work.fired = sorted(k for k, v in scored.penalties.items() if v > 0)
    finally:
        await app.stop()
        await bus.stop()


async def train_two_batches(work: Work, tmp_path: Path) -> None:
    """The learning loop (generic PPO) trains two batches of version-0 trajectories with a
    version per update: the second batch is one version behind."""
    bus = InProcBus()
    await bus.start()
    topic = "metrics.scored"
    try:
        await bus.create_topics([TopicSpec(topic, 1)])
        ids = [f"m-{k:02d}" for k in range(16)]
        await publish_trajectories(bus, topic, ids, behaviour_policy(), version=0)
        config = LoopConfig(
            checkpoint_dir=tmp_path / "ckpt",
            topic=topic,
            policy_topic="metrics.policy",
            batch_trajectories=8,
            fetch_max=8,
            fetch_timeout_s=0.05,
            idle_flush_s=0.2,
            max_policy_lag=100,
        )
        algorithm = GenericPPO(
            GenericPPOConfig(
                obs_dim=OBS_DIM,
                n_actions=N_ACTIONS,
                artifacts_dir=tmp_path / "artifacts",
                signing_key=str(ensure_key_pair(tmp_path / "keys").private_path),
                minibatch_size=8,
            )
        )
        loop: LearningLoop[object] = LearningLoop(config, algorithm, bus)  # type: ignore[arg-type]
        state = await loop.run(until_trained=len(ids))
        work.trained = state.trained
    finally:
        await bus.stop()


async def exercise_every_metric(tmp_path: Path) -> Work:
    """Run every piece of :class:`Work` (sequentially: each owns its bus)."""
    work = Work()
    text = (default_tasks_dir() / DEFAULT_TASK).read_text(encoding="utf-8")
    work.demo = await asyncio.wait_for(run_demo(text, seed=7, workers=2), 60)
    await poison_consumer(work)
    await score_tool_abuse(work)
    await train_two_batches(work, tmp_path)
    return work
