"""The bootstrap at the end of a rollout, in the scripts whose environments are a SyncVectorEnv: GAE
must be given the value of the observation after the rollout's last step, as the agent sees it (the
continuous script's normalized one), computed with the weights of the rollout. A value of the last
stored observation (one step early), of a reset observation, or of an unnormalized one, differs.
(envpool's pools: tests/test_ppo_atari_envpool.py's two-pools test; time-limit cuts inside a
rollout: tests/test_algorithm.py.)"""

import importlib

import numpy as np
import pytest
import torch

TINY = {  # a run of two iterations of each script, and what it needs installed
    "ppo": (dict(env_id="CartPole-v1", total_timesteps=256, num_envs=2, num_steps=64,
                 num_minibatches=2), ()),
    "ppo_continuous_action": (dict(env_id="Pendulum-v1", total_timesteps=128, num_envs=2,
                                   num_steps=32, num_minibatches=2, update_epochs=1), ()),
    "ppo_atari": (dict(env_id="BreakoutNoFrameskip-v4", total_timesteps=64, num_envs=2,
                       num_steps=16, num_minibatches=2, update_epochs=1), ("ale_py", "cv2")),
    # CartPole's actions as one part
    "ppo_multidiscrete": (dict(env_id="CartPole-v1", total_timesteps=256, num_envs=2, num_steps=64,
                               num_minibatches=2), ()),
}


@pytest.mark.parametrize("script", list(TINY))
def test_gae_bootstraps_from_the_observation_after_the_last_step(script, workdir, monkeypatch):
    settings, needs = TINY[script]
    for package in needs:
        pytest.importorskip(package)
    module = importlib.import_module(f"ppo.{script}")
    after_each_step, agents, bootstraps = [], [], []

    make_envs = module.make_envs

    def recording_make_envs(*inputs, **options):
        envs = make_envs(*inputs, **options)
        step = envs.step

        def recording_step(actions):
            result = step(actions)
            after_each_step.append(np.array(result[0], copy=True))
            return result

        envs.step = recording_step
        return envs

    class RecordedAgent(module.Agent):
        def __init__(self, *inputs, **options):
            super().__init__(*inputs, **options)
            agents.append(self)

    compute_gae = module.compute_gae

    def checking_gae(rewards, values, dones, next_value, next_done, *rest):
        (agent,) = agents
        obs = after_each_step[-1]
        if script == "ppo_continuous_action":
            # as the agent sees it, with the statistics as they stand
            obs = agent.normalize_obs(obs, update=False)
        with torch.no_grad():
            expected = agent.get_value(torch.as_tensor(obs, dtype=None if script == "ppo_atari"
                                                       else torch.float32))
        bootstraps.append((np.asarray(next_value).copy(), expected.flatten().numpy()))
        return compute_gae(rewards, values, dones, next_value, next_done, *rest)

    monkeypatch.setattr(module, "make_envs", recording_make_envs)
    monkeypatch.setattr(module, "Agent", RecordedAgent)
    monkeypatch.setattr(module, "compute_gae", checking_gae)
    module.main(module.Args(cuda=False, **settings))

    assert len(bootstraps) == 2  # both iterations
    for given, expected in bootstraps:
        np.testing.assert_allclose(given, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(bootstraps[0][0], bootstraps[1][0])  # the check can tell values apart


# The scripts with --bootstrap-truncated, each with a run of one iteration of two environments.
CUT_RUNS = {
    "ppo": (dict(env_id="CartPole-v1", num_steps=8), ()),
    "ppo_continuous_action": (dict(env_id="Pendulum-v1", num_steps=8), ()),
    "ppo_atari": (dict(env_id="BreakoutNoFrameskip-v4", num_steps=8), ("ale_py", "cv2")),
    "ppo_atari_lstm": (dict(env_id="BreakoutNoFrameskip-v4", num_steps=8), ("ale_py", "cv2")),
    "ppo_atari_multigpu": (dict(env_id="BreakoutNoFrameskip-v4", num_steps=8), ("ale_py", "cv2")),
    "ppo_atari_envpool": (dict(env_id="Breakout-v5", num_steps=8), ("envpool",)),
    "ppo_multidiscrete": (dict(env_id="CartPole-v1", num_steps=8), ()),
}
CUT_AT = 3  # the step of the rollout whose end the test makes both kinds of end


def ends_made_at(step: int, terminations, truncations, infos, obs):
    """Step `step` of the rollout, as the environments return it, made to end both environments'
    episodes there: environment 0's by its task and its time limit at once (terminated and
    truncated), environment 1's by its time limit alone; each final observation is the one the
    environment returned."""
    terminations, truncations = np.array(terminations, copy=True), np.array(truncations, copy=True)
    if step == CUT_AT:
        terminations[0], truncations[:] = True, True
        final_obs = np.empty(len(truncations), dtype=object)
        for i in range(len(truncations)):
            final_obs[i] = np.array(obs[i], copy=True)
        infos = {**infos, "final_obs": final_obs,
                 "_final_obs": np.ones(len(truncations), dtype=bool)}
    return terminations, truncations, infos


@pytest.mark.parametrize("script", list(CUT_RUNS))
def test_a_step_both_terminated_and_truncated_adds_no_bootstrap_in_the_real_loop(
        script, workdir, monkeypatch):
    """[Truncation] Through each script's own rollout loop: at a step whose episode the task ended
    as the time limit struck (terminated and truncated at once) the episode is over, and nothing is
    bootstrapped; a step cut by the time limit alone is (--bootstrap-truncated). A loop that took
    every truncation as a cut (`cut_off = truncations`) would value the terminated one too."""
    settings, needs = CUT_RUNS[script]
    for package in needs:
        pytest.importorskip(package)
    module = importlib.import_module(f"ppo.{script}")
    steps, cuts = [0], []
    make_envs = module.make_envs

    def made_to_end_both_ways(*inputs, **options):
        envs = make_envs(*inputs, **options)
        if script == "ppo_atari_envpool":  # a pool: its steps come back from recv()
            recv = envs.recv

            def ending_recv(*inputs, **options):
                if options.get("reset"):  # the pool's reset() receives its first observations so
                    return recv(*inputs, **options)
                obs, reward, terminations, truncations, info = recv(*inputs, **options)
                terminations, truncations, info = ends_made_at(steps[0], terminations,
                                                               truncations, info, obs)
                steps[0] += 1
                return obs, reward, terminations, truncations, info

            envs.recv = ending_recv
        else:
            step = envs.step

            def ending_step(actions):
                obs, reward, terminations, truncations, infos = step(actions)
                terminations, truncations, infos = ends_made_at(steps[0], terminations,
                                                                truncations, infos, obs)
                steps[0] += 1
                return obs, reward, terminations, truncations, infos

            envs.step = ending_step
        return envs

    truncated_value = module.truncated_value

    def recording_value(agent, infos, truncated, *rest):
        cuts.append(np.array(truncated, copy=True))
        return truncated_value(agent, infos, truncated, *rest)

    monkeypatch.setattr(module, "truncated_value", recording_value)
    monkeypatch.setattr(module, "make_envs", made_to_end_both_ways)
    module.main(module.Args(num_envs=2, num_minibatches=2, update_epochs=1,
                            total_timesteps=2 * settings["num_steps"], bootstrap_truncated=True,
                            cuda=False, **settings))
    assert cuts[CUT_AT].tolist() == [False, True]
