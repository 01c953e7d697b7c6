"""The bootstrap at the end of a rollout, in the scripts whose environments are a SyncVectorEnv: GAE
must be given the value of the observation after the rollout's last step, as the agent sees it (the
continuous script's normalized one), computed with the weights of the rollout. A value of the last
stored observation (one step early), of a reset observation, or of an unnormalized one, differs.
(envpool's pools: tests/test_ppo_atari_envpool.py's two-pools test; time-limit cuts inside a rollout:
tests/test_algorithm.py.)"""

import importlib

import numpy as np
import pytest
import torch

TINY = {  # a run of two iterations of each script, and what it needs installed
    "ppo": (dict(env_id="CartPole-v1", total_timesteps=256, num_envs=2, num_steps=64, num_minibatches=2), ()),
    "ppo_continuous_action": (dict(env_id="Pendulum-v1", total_timesteps=128, num_envs=2, num_steps=32,
                                   num_minibatches=2, update_epochs=1), ()),
    "ppo_atari": (dict(env_id="BreakoutNoFrameskip-v4", total_timesteps=64, num_envs=2, num_steps=16,
                       num_minibatches=2, update_epochs=1), ("ale_py", "cv2")),
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
        if script == "ppo_continuous_action":  # as the agent sees it, with the statistics as they stand
            obs = agent.normalize_obs(obs, update=False)
        with torch.no_grad():
            expected = agent.get_value(torch.as_tensor(obs, dtype=None if script == "ppo_atari" else torch.float32))
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
