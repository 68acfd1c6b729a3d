"""Collecting swarm episodes with a policy, many sessions in lock-step.

Each call of the network decides for every live session at once (one batched forward pass),
which is what makes a few-thousand-parameter attention policy cheap enough to train on CPU.
Rule engines (cpls, greedy, sequential) run through the same loop, so behaviour cloning sees
exactly the observations the learned policy will see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from podium.envs.swarm import SwarmEnv, TaskSpec, make_policy
from podium.envs.swarm.trajectory import episode_trajectory
from podium.train.agent import SwarmAgent, guard_mask
from podium.train.episodes import Episode, episode_to_decisions
from podium.v1 import trajectory_pb2


@dataclass(frozen=True, slots=True)
class Job:
    """One session to run: a task and the seed of its simulated sub-agents."""

    task: TaskSpec
    seed: int


def _new_episode(n: int) -> dict[str, list[object]]:
    keys = ("slots", "globals", "masks", "actions", "log_probs", "values", "rewards", "teacher")
    return {k: [] for k in keys}


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

    ``teacher`` (a rule engine name) labels every state the acting policy visits with what the
    rule engine would do there (DAgger, Ross et al. 2011): cloning those labels corrects the
    states the learner itself drifts into, which plain cloning of the teacher's own sessions
    never shows it.
    """
    if (agent is None) == (rule is None):
        raise ValueError("pass exactly one of agent= and rule=")
    engine = make_policy(rule) if rule is not None else None
    labeller = make_policy(teacher) if teacher is not None else None
    layout = envs[0].layout
    F, S = layout.slot_features, layout.max_subtasks
    A = len(layout.agents)
    per_slot = A * 3
    episodes: list[Episode | None] = [None] * len(jobs)
    trajs: list[trajectory_pb2.Trajectory | None] = [None] * len(jobs)
    pending = list(enumerate(jobs))[::-1]
    live: dict[int, tuple[int, dict[str, list[object]], np.ndarray]] = {}

    def launch(e: int) -> None:
        j, job = pending.pop()
        obs, _ = envs[e].reset(seed=job.seed, options={"task": job.task})
        live[e] = (j, _new_episode(len(job.task.subtasks)), obs)

    for e in range(min(len(envs), len(pending))):
        launch(e)
    while live:
        order = sorted(live)
        n_max = max(len(envs[e].task.subtasks) for e in order)
        obs = np.stack([live[e][2] for e in order])
        if agent is not None:
            masks = np.stack(
                [guard_mask(envs[e].state, envs[e].action_masks(), envs[e].codec) for e in order]
            )
        else:
            masks = np.stack([envs[e].action_masks() for e in order])
        if agent is not None:
            res = agent.act(obs, masks, n_max, greedy=greedy, generator=generator)
            actions, lps, vals = res.actions, res.log_probs, res.values
        else:
            assert engine is not None
            actions = np.array([engine.act(envs[e]) for e in order], dtype=np.int64)
            lps = np.zeros(len(order), dtype=np.float32)
            vals = np.zeros(len(order), dtype=np.float32)
        for i, e in enumerate(order):
            j, rec, o = live[e]
            n = len(envs[e].task.subtasks)
            rec["slots"].append(o[: S * F].reshape(S, F)[:n].copy())
            rec["globals"].append(o[S * F :].copy())
            m = masks[i]
            rec["masks"].append(np.concatenate([m[: n * per_slot], m[-2:]]))
            a = int(actions[i])
            rec["actions"].append(a if a < S * per_slot else n * per_slot + (a - S * per_slot))
            if labeller is not None:
                t = int(labeller.act(envs[e]))
                rec["teacher"].append(t if t < S * per_slot else n * per_slot + (t - S * per_slot))
            rec["log_probs"].append(float(lps[i]))
            rec["values"].append(float(vals[i]))
            o2, r, term, trunc, info = envs[e].step(a)
            rec["rewards"].append(float(r))
            if not (term or trunc):
                live[e] = (j, rec, o2)
                continue
            ep = Episode(
                n=n,
                slots=np.stack(rec["slots"]),  # type: ignore[arg-type]
                globals_=np.stack(rec["globals"]),  # type: ignore[arg-type]
                masks=np.stack(rec["masks"]),  # type: ignore[arg-type]
                actions=np.asarray(rec["actions"], dtype=np.int64),
                log_probs=np.asarray(rec["log_probs"], dtype=np.float32),
                values=np.asarray(rec["values"], dtype=np.float32),
                rewards=np.asarray(rec["rewards"], dtype=np.float32),
                terminated=bool(term),
                info=dict(info),
                policy_version=policy_version,
                teacher=np.asarray(rec["teacher"], dtype=np.int64) if labeller else None,
            )
            episodes[j] = ep
            if with_trajectories:
                traj = episode_trajectory(
                    envs[e],
                    policy_version=str(policy_version),
                    labels={"policy": rule or "learned", "seed": str(jobs[j].seed)},
                )
                episode_to_decisions(ep, traj)
                trajs[j] = traj
            if on_episode is not None:
                on_episode(ep)
            del live[e]
            if pending:
                launch(e)
    done_eps = [ep for ep in episodes if ep is not None]
    done_trajs = [t for t in trajs if t is not None]
    return done_eps, done_trajs
