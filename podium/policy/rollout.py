"""Collecting swarm episodes with a policy, many sessions in lock-step.

Each call of the network decides for every live session at once (one batched forward pass),
which is what makes a few-thousand-parameter attention policy cheap enough to train on CPU.
Rule engines (cpls, greedy, sequential) run through the same loop, so behaviour cloning sees
exactly the observations the learned policy will see.

The environments of one call may run different pools (a training suite mixing pools, agents
of other names or numbers): their observations then differ in size, so the sessions of each
pool are cut by their own layout and the batch is padded to the most slots *and* agents
(:func:`podium.policy.agent.act_mixed`) — still one forward pass per step. Each pool's
sessions are recorded in their own layout (their episodes carry their pool's agents).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from podium.envs.swarm import SwarmEnv, TaskSpec
from podium.envs.swarm.observation import ObservationLayout
from podium.envs.swarm.planner import make_scheduler
from podium.envs.swarm.scheduling import SchedulingPolicy
from podium.envs.swarm.trajectory import ACTIONS_LABEL, ARGMAX, SAMPLED, episode_trajectory
from podium.policy.agent import Group, SwarmAgent, act_by_size, act_mixed, guard_mask
from podium.policy.decisions import Episode, EpisodeRecorder, decision_data
from podium.v1 import trajectory_pb2


@dataclass(frozen=True, slots=True)
class Job:
    """One session to run: a task and the seed of its simulated sub-agents."""

    task: TaskSpec
    seed: int
    baseline: trajectory_pb2.RolloutBaseline | None = None
    """A reference policy's return on this (task, seed), recorded in its trajectory."""


@dataclass(slots=True)
class _Live:
    """A session in flight on one environment."""

    job: int
    """Index of its job."""
    recorder: EpisodeRecorder
    obs: NDArray[np.float32]
    """The observation the next decision is made on."""


@dataclass(frozen=True, slots=True)
class _Choices:
    """One batched decision: actions (environment layout), log-probs and values."""

    actions: NDArray[np.int64]
    log_probs: NDArray[np.float32]
    values: NDArray[np.float32]


class _LockStep:
    """The state of one :func:`run_episodes` call (see its docstring)."""

    def __init__(
        self,
        envs: Sequence[SwarmEnv],
        jobs: Sequence[Job],
        agent: SwarmAgent | None,
        engine: SchedulingPolicy | None,
        labeller: SchedulingPolicy | None,
    ) -> None:
        self.envs = envs
        self.jobs = jobs
        self.agent = agent
        self.engine = engine
        self.labeller = labeller
        self.pending = list(enumerate(jobs))[::-1]
        self.live: dict[int, _Live] = {}
        self.agents: dict[ObservationLayout, SwarmAgent] = {}
        """The network bound to each pool's layout met so far (all share ``agent.net``)."""
        if agent is not None:
            self.agents[agent.layout] = agent

    def agent_for(self, layout: ObservationLayout) -> SwarmAgent:
        """The learned policy bound to ``layout`` (an environment's: its pool's)."""
        assert self.agent is not None
        bound = self.agents.get(layout)
        if bound is None:
            bound = SwarmAgent(layout, net=self.agent.net)
            self.agents[layout] = bound
        return bound

    def launch(self, e: int) -> None:
        """Start the next pending job on environment ``e``."""
        j, job = self.pending.pop()
        env = self.envs[e]
        obs, _ = env.reset(seed=job.seed, options={"task": job.task})
        self.live[e] = _Live(j, EpisodeRecorder(env.layout, env.codec, len(job.task.subtasks)), obs)

    def masks(self, order: list[int]) -> list[NDArray[np.bool_]]:
        """The masks the policy decides on, in ``order`` (each in its pool's action layout):
        guarded for the learned policy (never a start that loop detection would end the
        session on), as they are for a rule engine."""
        envs = self.envs
        if self.agent is not None:
            return [guard_mask(envs[e].state, envs[e].action_masks(), envs[e].codec) for e in order]
        return [envs[e].action_masks() for e in order]

    def decide(
        self,
        order: list[int],
        masks: list[NDArray[np.bool_]],
        greedy: bool,
        generator: torch.Generator | None,
    ) -> _Choices:
        """One decision for every live session, in ``order``."""
        if self.agent is not None:
            return self._decide_learned(order, masks, greedy, generator)
        assert self.engine is not None
        engine = self.engine
        return _Choices(
            np.array([engine.act(self.envs[e]).action for e in order], dtype=np.int64),
            np.zeros(len(order), dtype=np.float32),
            np.zeros(len(order), dtype=np.float32),
        )

    def _decide_learned(
        self,
        order: list[int],
        masks: list[NDArray[np.bool_]],
        greedy: bool,
        generator: torch.Generator | None,
    ) -> _Choices:
        """The learned policy's decisions: one padded forward pass over every pool's sessions
        (one group per layout, groups in order of first appearance); sessions of one pool
        alone are cut into passes by task size (:func:`~podium.policy.agent.act_by_size`)."""
        rows: dict[ObservationLayout, list[int]] = {}
        for i, e in enumerate(order):
            rows.setdefault(self.envs[e].layout, []).append(i)
        if len(rows) == 1:
            res = act_by_size(
                self.agent_for(self.envs[order[0]].layout),
                np.stack([self.live[e].obs for e in order]),
                np.stack(masks),
                [len(self.envs[e].task.subtasks) for e in order],
                greedy=greedy,
                generator=generator,
            )
            return _Choices(res.actions, res.log_probs, res.values)
        groups = []
        for layout, idx in rows.items():
            envs = [order[i] for i in idx]
            groups.append(
                Group(
                    self.agent_for(layout),
                    np.stack([self.live[e].obs for e in envs]),
                    np.stack([masks[i] for i in idx]),
                    max(len(self.envs[e].task.subtasks) for e in envs),
                )
            )
        results = act_mixed(groups, greedy=greedy, generator=generator)
        actions = np.zeros(len(order), dtype=np.int64)
        log_probs = np.zeros(len(order), dtype=np.float32)
        values = np.zeros(len(order), dtype=np.float32)
        for idx, res in zip(rows.values(), results, strict=True):
            actions[idx] = res.actions
            log_probs[idx] = res.log_probs
            values[idx] = res.values
        return _Choices(actions, log_probs, values)

    def advance(
        self, e: int, mask: NDArray[np.bool_], action: int, log_prob: float, value: float
    ) -> tuple[bool, bool, dict[str, Any]]:
        """Record and apply one decision of environment ``e``'s session; (terminated,
        truncated, info) of the step."""
        live, env = self.live[e], self.envs[e]
        teacher = None if self.labeller is None else self.labeller.act(env).action
        live.recorder.record(live.obs, mask, action, log_prob, value, teacher)
        live.obs, reward, terminated, truncated, info = env.step(action)
        live.recorder.reward(reward)
        return terminated, truncated, info


def _labels(job: Job, rule: str | None, greedy: bool) -> dict[str, str]:
    labels = {"policy": rule or "learned", "seed": str(job.seed)}
    if rule is None:
        labels[ACTIONS_LABEL] = ARGMAX if greedy else SAMPLED
    return labels


def run_episodes(
    envs: Sequence[SwarmEnv],
    jobs: Sequence[Job],
    *,
    agent: SwarmAgent | None = None,
    rule: str | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    policy_version: int = 0,
    with_trajectories: bool = False,
    on_episode: Callable[[Episode], None] | None = None,
    teacher: str | None = None,
) -> tuple[list[Episode], list[trajectory_pb2.Trajectory]]:
    """Run every job to its end on ``envs`` (len(envs) sessions at a time).

    Exactly one of ``agent`` (the learned policy; sampled, or argmax when ``greedy``) and
    ``rule`` (a rule engine name: its actions are recorded with log-prob 0) decides. Returns
    the episodes in job order and, if ``with_trajectories``, their ``Trajectory`` messages
    with the training tensors in each decision.

    ``teacher`` (a rule engine or planner name, :func:`~podium.envs.swarm.planner.make_scheduler`) labels every state the acting policy visits with what the
    rule engine would do there (DAgger, Ross et al. 2011): cloning those labels corrects the
    states the learner itself drifts into, which plain cloning of the teacher's own sessions
    never shows it.
    """
    if (agent is None) == (rule is None):
        raise ValueError("pass exactly one of agent= and rule=")
    run = _LockStep(
        envs,
        jobs,
        agent,
        make_scheduler(rule) if rule is not None else None,
        make_scheduler(teacher) if teacher is not None else None,
    )
    episodes: list[Episode | None] = [None] * len(jobs)
    trajs: list[trajectory_pb2.Trajectory | None] = [None] * len(jobs)
    for e in range(min(len(envs), len(run.pending))):
        run.launch(e)
    while run.live:
        order = sorted(run.live)
        masks = run.masks(order)
        choices = run.decide(order, masks, greedy, generator)
        for i, e in enumerate(order):
            a = int(choices.actions[i])
            terminated, truncated, info = run.advance(
                e, masks[i], a, float(choices.log_probs[i]), float(choices.values[i])
            )
            if not (terminated or truncated):
                continue
            live = run.live.pop(e)
            ep = live.recorder.episode(
                terminated=terminated, info=info, policy_version=policy_version
            )
            episodes[live.job] = ep
            if with_trajectories:
                trajs[live.job] = episode_trajectory(
                    envs[e],
                    policy_version=str(policy_version),
                    labels=_labels(jobs[live.job], rule, greedy),
                    data=decision_data(ep),
                    baseline=jobs[live.job].baseline,
                )
            if on_episode is not None:
                on_episode(ep)
            if run.pending:
                run.launch(e)
    return [ep for ep in episodes if ep is not None], [t for t in trajs if t is not None]
