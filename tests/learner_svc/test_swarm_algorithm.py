"""Episodes on the wire, batching, behaviour cloning, PPO and checkpoints of the swarm policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from learner_svc.algorithms.swarm import (
    SwarmPPOConfig,
    behaviour_cloning,
    cloning_loss,
    collate,
    departures,
    episode_advantages,
    ppo_update,
)
from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.actions import START, ActionCodec
from podium.envs.swarm.generator import generate_suite
from podium.errors import ArtifactError, DecodeError
from podium.policy.agent import SwarmAgent
from podium.policy.decisions import Episode, episode_from_trajectory
from podium.policy.rollout import Job, run_episodes
from podium.policy.swarm import LearnedPolicy, load_policy, resolve_checkpoint, save_policy


@pytest.fixture(scope="module")
def setup() -> tuple[list[SwarmEnv], list[Job]]:
    tasks = generate_suite(12, seed=5, sizes=(4, 12))
    envs = [
        SwarmEnv(tasks, default_pool(), EnvConfig(max_subtasks=16, invalid_action="raise"))
        for _ in range(4)
    ]
    return envs, [Job(t, 100 + i) for i, t in enumerate(tasks)]


def _agent(envs: list[SwarmEnv]) -> SwarmAgent:
    torch.manual_seed(0)
    return SwarmAgent(envs[0].layout, d_model=32, layers=1)


def test_episode_survives_the_trajectory_wire_format(
    setup: tuple[list[SwarmEnv], list[Job]],
) -> None:
    envs, jobs = setup
    agent = _agent(envs)
    eps, trajs = run_episodes(envs, jobs[:4], agent=agent, with_trajectories=True)
    lay = envs[0].layout
    for ep, traj in zip(eps, trajs, strict=True):
        wire = type(traj).FromString(traj.SerializeToString())
        back = episode_from_trajectory(
            wire, lay.slot_features, lay.global_token_features, len(lay.agents)
        )
        np.testing.assert_array_equal(back.slots, ep.slots)
        np.testing.assert_array_equal(back.globals_, ep.globals_)
        np.testing.assert_array_equal(back.pairs, ep.pairs)
        assert back.agents == ep.agents == tuple(lay.agents)
        np.testing.assert_array_equal(back.masks, ep.masks)
        np.testing.assert_array_equal(back.actions, ep.actions)
        np.testing.assert_allclose(back.log_probs, ep.log_probs, rtol=1e-6)
        np.testing.assert_allclose(back.rewards, ep.rewards, rtol=1e-6)
        assert back.terminated == ep.terminated
        # Every recorded action was valid under its recorded mask, and log-probs are real.
        assert ep.masks[np.arange(ep.length), ep.actions].all()
        assert (ep.log_probs <= 0).all() and (ep.log_probs < 0).any()


def test_corrupt_tensors_are_rejected_with_a_clear_error(
    setup: tuple[list[SwarmEnv], list[Job]],
) -> None:
    envs, jobs = setup
    _, trajs = run_episodes(envs, jobs[:1], rule="cpls", with_trajectories=True)
    lay = envs[0].layout
    traj = trajs[0]
    traj.decisions[1].observation_tensor = b"not zlib"
    with pytest.raises(DecodeError, match=r"decision 1.*observation_tensor"):
        episode_from_trajectory(traj, lay.slot_features, lay.global_token_features, len(lay.agents))


def test_collate_pads_and_remaps_control_actions(setup: tuple[list[SwarmEnv], list[Job]]) -> None:
    envs, jobs = setup
    eps, _ = run_episodes(envs, jobs, rule="greedy")
    small = min(range(len(eps)), key=lambda i: eps[i].n)
    big = max(range(len(eps)), key=lambda i: eps[i].n)
    A = envs[0].pool.num_agents
    wait_t = int(np.flatnonzero(eps[small].actions >= eps[small].n * A * 3)[0])
    batch, n_max = collate(eps, np.array([[small, wait_t], [big, 0]]))
    assert n_max == eps[big].n
    assert batch.slots.shape[1] == n_max
    assert not batch.present[0, eps[small].n :].any()
    assert batch.pairs.shape[:3] == (2, n_max, A)
    # WAIT of the small task lands on WAIT of the padded layout, and stays valid there.
    assert int(batch.actions[0]) == n_max * A * 3
    assert bool(batch.masks[0, batch.actions[0]])


def test_advantages_match_a_hand_computation() -> None:
    from podium.policy.decisions import Episode

    ep = Episode(
        n=1,
        slots=np.zeros((3, 1, 2), np.float32),
        globals_=np.zeros((3, 1), np.float32),
        pairs=np.zeros((3, 1, 1, 2), np.float32),
        agents=("a",),
        masks=np.ones((3, 5), bool),
        actions=np.zeros(3, np.int64),
        log_probs=np.zeros(3, np.float32),
        values=np.array([1.0, 2.0, 3.0], np.float32),
        rewards=np.array([0.5, -1.0, 2.0], np.float32),
        terminated=True,
    )
    cfg = SwarmPPOConfig(gamma=1.0, gae_lambda=0.5)
    adv, ret = episode_advantages(ep, terminal_bonus=1.0, config=cfg)
    d2 = 2.0 + 1.0 - 3.0  # last reward + bonus, terminal: no bootstrap
    d1 = -1.0 + 3.0 - 2.0
    d0 = 0.5 + 2.0 - 1.0
    a2 = d2
    a1 = d1 + 0.5 * a2
    a0 = d0 + 0.5 * a1
    np.testing.assert_allclose(adv, [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(ret, [a0 + 1.0, a1 + 2.0, a2 + 3.0], rtol=1e-6)


def test_behaviour_cloning_imitates_cpls_and_ppo_updates_run(
    setup: tuple[list[SwarmEnv], list[Job]],
) -> None:
    envs, jobs = setup
    agent = _agent(envs)
    demos, _ = run_episodes(envs, jobs, rule="cpls")
    rng = np.random.default_rng(0)
    hist = behaviour_cloning(agent, demos, SwarmPPOConfig(minibatch_size=64), rng, epochs=40)
    assert hist[-1]["bc_loss"] < hist[0]["bc_loss"]
    assert hist[-1]["bc_accuracy"] > 0.8
    # The cloned policy, acting greedily, agrees with cpls on most of its own decisions.
    eps, _ = run_episodes(envs, jobs, agent=agent, greedy=True)
    assert np.mean([e.info["completed"] for e in eps]) == 1.0
    # DAgger labels: in every state the policy visits, what cpls would do there (valid there).
    labelled, _ = run_episodes(envs, jobs, agent=agent, greedy=True, teacher="cpls")
    for ep in labelled:
        assert ep.teacher is not None and ep.teacher.shape == ep.actions.shape
        assert ep.masks[np.arange(ep.length), ep.teacher].all()
    agreement = np.mean(np.concatenate([ep.actions == ep.teacher for ep in labelled]))
    assert agreement > 0.9, agreement  # the advice columns make cpls easy to follow
    before = [p.detach().clone() for p in agent.net.parameters()]
    opt = torch.optim.Adam(agent.net.parameters(), lr=3e-4)
    samples, _ = run_episodes(envs, jobs, agent=agent)
    stats = ppo_update(
        agent, opt, samples, [0.5] * len(samples), SwarmPPOConfig(), rng, progress=0.0
    )
    for k in ("pg_loss", "v_loss", "entropy", "approx_kl", "clip_fraction", "lr"):
        assert np.isfinite(stats[k]), k
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.net.parameters(), strict=True))


def test_a_run_directory_resolves_to_its_highest_version(
    tmp_path: Path, setup: tuple[list[SwarmEnv], list[Job]]
) -> None:
    """``checkpoints/<model>/10`` beats ``9`` (numeric, not alphabetical, and whatever was
    written last): what ``--init`` / ``--checkpoint`` of an unfinished run directory load."""
    envs, _ = setup
    agent = _agent(envs)
    agents = tuple(envs[0].layout.agents)
    ten = save_policy(agent.net, tmp_path / "checkpoints", 10, agents)
    nine = save_policy(agent.net, tmp_path / "checkpoints", 9, agents)
    assert nine.path.stat().st_mtime >= ten.path.stat().st_mtime
    assert resolve_checkpoint(tmp_path) == ten.path


def test_checkpoint_round_trip_and_tampering(
    tmp_path: Path, setup: tuple[list[SwarmEnv], list[Job]]
) -> None:
    envs, jobs = setup
    agent = _agent(envs)
    agents = tuple(envs[0].layout.agents)
    ref = save_policy(agent.net, tmp_path, 3, agents)
    net, got_agents = load_policy(ref.path)
    assert got_agents == agents
    for a, b in zip(agent.net.state_dict().values(), net.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert resolve_checkpoint(tmp_path) == ref.path
    policy = LearnedPolicy.from_checkpoint(ref.path)
    env = envs[0]
    env.reset(seed=1, options={"task": jobs[0].task})
    assert env.action_masks()[policy.act(env).action]
    data = bytearray(ref.path.read_bytes())
    data[-10] ^= 0xFF
    ref.path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        load_policy(ref.path)


def test_guard_mask_removes_only_the_starts_loop_detection_would_end() -> None:
    from podium.envs.swarm import parse_pool, parse_task
    from podium.policy.agent import guard_mask

    pool = parse_pool(
        {
            "max_parallel": 2,
            "main_step_cost": 0.0,
            "split_overhead": 0.1,
            "agents": [
                {"name": "flaky", "kinds": {"x": {"speed": 2.0, "success": 0.0, "noise": 0.0}}},
                {"name": "solid", "kinds": {"x": {"speed": 1.0, "success": 1.0, "noise": 0.0}}},
            ],
        }
    )
    task = parse_task({"name": "one", "subtasks": [{"id": "a", "kind": "x", "work": 1.0}]})
    env = SwarmEnv([task], pool, EnvConfig(max_subtasks=1, invalid_action="raise"))
    env.reset(seed=0)
    flaky = env.codec.start(0, 0, 1)
    solid = env.codec.start(0, 1, 1)
    for _ in range(env.config.loop_retry_limit):
        guarded = guard_mask(env.state, env.action_masks(), env.codec)
        assert guarded[flaky] and guarded[solid]
        env.step(flaky)  # starts on the agent that always fails
        env.step(env.codec.wait)  # and sees it fail
    raw = env.action_masks()
    guarded = guard_mask(env.state, raw, env.codec)
    assert raw[flaky]  # the environment still allows it: loop detection would fire
    assert not guarded[flaky] and guarded[solid]
    _, _, term, _, info = env.step(flaky)
    assert term and info["loop_detected"]


def test_critic_only_update_moves_the_value_head_and_nothing_else(
    setup: tuple[list[SwarmEnv], list[Job]],
) -> None:
    envs, jobs = setup
    agent = _agent(envs)
    samples, _ = run_episodes(envs, jobs, agent=agent)
    before = {k: v.detach().clone() for k, v in agent.net.state_dict().items()}
    opt = torch.optim.Adam(agent.net.parameters(), lr=3e-4)
    bonus = [2.5] * len(samples)  # an offset the critic has never seen
    cfg = SwarmPPOConfig()

    def value_error() -> tuple[float, float]:
        """(mean squared error, mean error) of V against the returns."""
        errs, bias = [], []
        for ep, b in zip(samples, bonus, strict=True):
            _, ret = episode_advantages(ep, b, cfg)
            idx = np.array([(0, t) for t in range(ep.length)], dtype=np.int64)
            batch, _ = collate([ep], idx)
            with torch.no_grad():
                _, v = agent.net(
                    batch.slots, batch.present, batch.globals_, batch.pairs, batch.masks
                )
            errs.append(float(((v.numpy() - ret) ** 2).mean()))
            bias.append(float((v.numpy() - ret).mean()))
        return float(np.mean(errs)), float(np.mean(bias))

    err0, bias0 = value_error()
    assert abs(bias0) > 0.5
    stats = ppo_update(
        agent, opt, samples, bonus, cfg, np.random.default_rng(0), progress=0.0, critic_only=True
    )
    assert stats["critic_only"] == 1.0
    after = agent.net.state_dict()
    for k, v in before.items():
        if k.startswith("value_head."):
            continue
        assert torch.equal(v, after[k]), f"{k} moved in a critic-only update"
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("value_head."))
    err1, bias1 = value_error()
    assert err1 < 0.8 * err0 and abs(bias1) < 0.2, (err0, bias0, err1, bias1)


def test_decision_tensors_decode_by_the_documented_wire_layout() -> None:
    """``Decision.observation_tensor`` and ``action_mask`` as trajectory.proto documents them,
    decoded with nothing but zlib and integer arithmetic: the observation without its padding
    slots (slot rows, the global token, then the (slot, agent) pair rows of the
    ``Trajectory.agents``), and the mask of the task's own action layout, first action in the most
    significant bit."""
    import zlib

    from podium.envs.swarm import make_policy
    from podium.envs.swarm.generator import generate_task
    from podium.envs.swarm.trajectory import episode_trajectory
    from podium.policy.decisions import EpisodeRecorder

    task = generate_task("diamond", 7, 3)
    env = SwarmEnv([task], default_pool(), EnvConfig(max_subtasks=12, invalid_action="raise"))
    n, S, A = len(task.subtasks), 12, env.pool.num_agents
    F, G = env.layout.slot_features, env.layout.global_token_features
    P = env.layout.pair_features
    cpls = make_policy("cpls")
    recorder = EpisodeRecorder(env.layout, env.codec, n)
    obs, _ = env.reset(seed=2)
    seen = []
    done = False
    while not done:
        mask = env.action_masks().copy()
        a = cpls.act(env).action
        recorder.record(obs, mask, a)
        seen.append((obs, mask))
        obs, reward, term, trunc, _ = env.step(a)
        recorder.reward(reward)
        done = term or trunc
    traj = episode_trajectory(env, data=recorder.decision_data())
    wire = type(traj).FromString(traj.SerializeToString())
    n_actions = n * A * 3 + 2
    assert list(wire.agents) == [a.name for a in default_pool().agents]  # A names, in order
    for d, (full_obs, full_mask) in zip(wire.decisions, seen, strict=True):
        values = np.frombuffer(zlib.decompress(d.observation_tensor), dtype="<f4")
        assert values.shape == (n * F + G + n * A * P,)
        rows = full_obs[: S * F].reshape(S, F)
        pairs = full_obs[S * F + G :].reshape(S, A, P)
        np.testing.assert_array_equal(values[: n * F].reshape(n, F), rows[:n])
        np.testing.assert_array_equal(values[n * F : n * F + G], full_obs[S * F : S * F + G])
        np.testing.assert_array_equal(values[n * F + G :].reshape(n, A, P), pairs[:n])
        assert not rows[n:].any() and not pairs[n:].any()  # what was dropped is padding
        data = d.action_mask
        assert len(data) == (n_actions + 7) // 8
        bits = [(byte >> (7 - j)) & 1 for byte in data for j in range(8)]
        assert not any(bits[n_actions:])
        starts = [bool(b) for b in bits[: n * A * 3]]
        assert starts == full_mask[: n * A * 3].tolist()
        assert bits[n * A * 3] == full_mask[env.codec.wait]
        assert bits[n * A * 3 + 1] == full_mask[env.codec.finish]
        # The decision's action, in the task's own layout, is valid under its recorded mask.
        own = {1: d.action.index, 2: n * A * 3, 3: n * A * 3 + 1}[d.action.type]
        assert bits[own] == 1
        assert d.action_mask_size == env.codec.size


@pytest.fixture(scope="module")
def split_demos() -> tuple[SwarmEnv, list[Episode]]:
    """cpls sessions on tasks up to 30 subtasks: a few of their starts split in 2 (the rare
    choice; most start whole, some split in 4)."""
    tasks = generate_suite(16, seed=5, sizes=(4, 30))
    env = SwarmEnv(tasks, default_pool(), EnvConfig(max_subtasks=32))
    demos, _ = run_episodes([env], [Job(t, 100 + i) for i, t in enumerate(tasks)], rule="cpls")
    return env, demos


def _split_choices(agent: SwarmAgent, demos: list[Episode]) -> list[tuple[int, int]]:
    """(teacher's k, policy's k) of every teacher START, on the teacher's own states; the
    policy's k is 0 when its argmax starts another pair or does not start."""
    out = []
    for ep in demos:
        b, _ = collate([ep], np.array([(0, t) for t in range(ep.length)]))
        with torch.no_grad():
            chosen = agent.net(b.slots, b.present, b.globals_, b.pairs, b.masks)[0].argmax(-1)
        codec = ActionCodec(ep.n, ep.num_agents)
        for a, p in zip(ep.actions, chosen.numpy(), strict=True):
            (ta, *pair_a, ka), (tp, *pair_p, kp) = codec.decode(int(a)), codec.decode(int(p))
            if ta == START:
                out.append((ka, kp if tp == START and pair_p == pair_a else 0))
    return out


def test_a_clone_reproduces_the_teachers_split_choice_even_the_rare_one(
    split_demos: tuple[SwarmEnv, list[Episode]],
) -> None:
    """Every split the teacher chose, 2 included, is the clone's choice on the same states.
    Clones used to start split 4 (or whole) where the teacher split in 2, even on their
    training states at 99.7 % accuracy: each split choice was learned from its own few
    examples. The advice gain is shared by all of them (started at 4, as for a teacher that
    follows the advice on most states)."""
    env, demos = split_demos
    torch.manual_seed(0)
    agent = SwarmAgent(env.layout)
    cfg = SwarmPPOConfig(bc_advice_gain=4.0, bc_departure_weight=8.0)
    behaviour_cloning(agent, demos, cfg, np.random.default_rng(0), epochs=4)
    choices = _split_choices(agent, demos)
    twos = [kp for ka, kp in choices if ka == 2]
    assert len(twos) >= 2 and {ka for ka, _ in choices} == {1, 2, 4}
    assert twos == [2] * len(twos), choices
    assert np.mean([ka == kp for ka, kp in choices]) > 0.99


def test_departures_from_the_advice_are_found_and_weighted(
    split_demos: tuple[SwarmEnv, list[Episode]],
) -> None:
    """A teacher label that is not the advised action is a departure (cpls's own labels never
    are); the cloning loss weighs it ``bc_departure_weight`` times an ordinary decision."""
    _env, demos = split_demos
    ep = demos[0]
    valid = [np.flatnonzero(ep.masks[t]) for t in range(ep.length)]
    moved = [t for t in range(ep.length) if len(valid[t]) > 1][:3]
    teacher = ep.actions.copy()
    for t in moved:
        teacher[t] = next(a for a in valid[t] if a != ep.actions[t])
    relabelled = replace(ep, teacher=teacher)
    idx = np.array([(0, t) for t in range(ep.length)])
    b, _ = collate([relabelled], idx, use_teacher=True)
    assert np.flatnonzero(departures(b).numpy()).tolist() == moved
    plain, _ = collate([ep], idx, use_teacher=True)
    assert not departures(plain).any()
    logits = torch.randn(ep.length, b.masks.shape[1])
    ce = torch.nn.functional.cross_entropy(logits, b.actions, reduction="none")
    w = torch.ones(ep.length)
    w[moved] = 5.0
    loss, departed = cloning_loss(logits, b, 5.0)
    torch.testing.assert_close(loss, (w * ce).sum() / w.sum())
    torch.testing.assert_close(cloning_loss(logits, b, 1.0)[0], ce.mean())
    assert departed.sum() == len(moved)
