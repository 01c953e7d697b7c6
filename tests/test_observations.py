"""What each script's agent observes, detail by detail, through the script's own environment factory
(the `make_env`/`make_envs` its main() calls), against references that share none of its code
(issue 28):

- Atari through ale-py (ppo_atari.py, ppo_atari_lstm.py, ppo_atari_multigpu.py): every frame the
  emulator runs is logged (FrameLog) and the observations are rebuilt from those raw frames with
  OpenCV; the same games are also replayed on ale-py's own C++ preprocessing, AtariVectorEnv.
- Atari through envpool (ppo_atari_envpool.py): envpool's games replayed frame by frame on ale-py's
  emulator (EmulatorReplay).
- Procgen (ppo_procgen.py): the same games made with procgen directly; the training rewards
  recomputed from the raw ones.
- ppo_continuous_action.py and ppo.py: the environments' own outputs, and what the agent is given,
  recomputed from them.

Where a detail cannot be compared with a reference, the test's docstring says why."""

import functools
import importlib
import math
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import pytest
import torch

from ppo_utils import procgen_games  # noqa: E402
from ppo_utils.environments import finished_episodes

ALE_SCRIPTS = ["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu"]
ALE_IDS = ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5"]
# Asterix: no FIRE action, 3 lives, 50 points a reward (a score summed from clipped rewards is 50
# times too small), and a random game is over in about 200 steps.
NO_FIRE_ID = "AsterixNoFrameskip-v4"
# The largest difference allowed between a frame of a script and the reference's, in gray levels:
# the two resizes may come from different OpenCV builds. (Measured: 0 with ale-py 0.12.1, envpool
# 1.0.1 and opencv-python 4.11, whose frames were identical.) A frame pooled wrongly, or not at all,
# differs by far more wherever a sprite is drawn in one frame and not in the other.
GRAY_LEVELS = 1


# --------------------------------------------------------------------------------------------------
# Helpers: recording what a run sees, and the reference's reward and observation statistics
# --------------------------------------------------------------------------------------------------


def record_outputs(monkeypatch, env_class: type) -> list:
    """Within the test, every reset() of `env_class` appends ("reset", obs) and every step()
    ("step", obs, reward, terminated, truncated), copied."""
    outputs = []
    reset, step = env_class.reset, env_class.step

    def recording_reset(self, *args, **kwargs):
        obs, info = reset(self, *args, **kwargs)
        outputs.append(("reset", np.array(obs, copy=True)))
        return obs, info

    def recording_step(self, actions):
        obs, reward, terminated, truncated, info = step(self, actions)
        outputs.append(("step", *(np.array(value, copy=True)
                                  for value in (obs, reward, terminated, truncated))))
        return obs, reward, terminated, truncated, info

    monkeypatch.setattr(env_class, "reset", recording_reset)
    monkeypatch.setattr(env_class, "step", recording_step)
    return outputs


def record_calls(monkeypatch, owner, name: str, keep) -> list:
    """Within the test, each call of owner.name appends keep(*args, **kwargs), then runs
    unchanged."""
    calls, original = [], getattr(owner, name)

    def recording(*args, **kwargs):
        calls.append(keep(*args, **kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls


def the_whole_batch(size: int):
    """A `keep` for record_calls on Agent.get_action_and_value: the observations of the batched pass
    over a whole rollout of `size` transitions; None for every other call (minibatches, single
    steps)."""
    return (lambda agent, obs, action=None: obs.clone()
            if action is not None and len(obs) == size else None)


def mean_and_var(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance over the first axis of all `samples`, merged with the prior that the
    references' running statistics start from (openai/baselines' RunningMeanStd and gymnasium's:
    mean 0, variance 1, a count of 1e-4), in closed form over the whole history rather than batch by
    batch as the scripts do."""
    prior, count = 1e-4, len(samples)
    total = prior + count
    mean, var = samples.mean(axis=0), samples.var(axis=0)
    return mean * count / total, (prior + var * count
                                  + np.square(mean) * prior * count / total) / total


def scaled_rewards(rewards: np.ndarray, restarts: np.ndarray, gamma: float, clip: float,
                   restart_after: bool) -> np.ndarray:
    """The reference's reward scaling, written from its description: per environment a return
    discounted by gamma accumulates the raw rewards; each reward is divided by the standard
    deviation of every return so far (all environments together, mean_and_var), then clipped to
    [-clip, clip]. The return restarts where `restarts` is set: after that step (restart_after:
    openai/baselines' VecNormalize, as Procgen's reference uses it), or at it, the terminal step's
    return being its own reward (gymnasium's NormalizeReward, as the MuJoCo reference uses it)."""
    returns, seen, scaled = np.zeros(rewards.shape[1]), [], np.zeros(rewards.shape)
    for t, (reward, restart) in enumerate(zip(rewards, restarts)):
        returns = returns * gamma * (1.0 if restart_after else 1.0 - restart) + reward
        seen.extend(returns)
        scaled[t] = np.clip(reward / np.sqrt(mean_and_var(np.array(seen))[1] + 1e-8), -clip, clip)
        if restart_after:
            returns = np.where(restart, 0.0, returns)
    return scaled


def assert_same_vector_env_outputs(made: gym.vector.VectorEnv, reference: gym.vector.VectorEnv,
                                   actions) -> None:
    """Both vector envs, seeded alike and given the same actions, return the same observations,
    rewards, terminations, truncations and final observations; some episodes end on the way."""
    np.testing.assert_array_equal(made.reset(seed=5)[0], reference.reset(seed=5)[0])
    ends = 0
    for t, action in enumerate(actions):
        ours, theirs = made.step(action), reference.step(action)
        for a, b in zip(ours[:4], theirs[:4]):
            np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
        for i in np.flatnonzero(theirs[4].get("_final_obs", [])):
            np.testing.assert_array_equal(ours[4]["final_obs"][i], theirs[4]["final_obs"][i])
            ends += 1
    assert ends > 0


@pytest.fixture
def one_torch_thread():
    """The tests that train run on one PyTorch thread: faster for these tiny batches on a busy
    2-core machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------------
# Helpers: raw Atari frames, and the observations they should become
# --------------------------------------------------------------------------------------------------


def ale_script(name: str):
    """The script's module, or a skip where ale-py or OpenCV is missing."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    return importlib.import_module(f"ppo.{name}")


def frames_per_observation(script) -> int:
    return 1 if script.VARIANT == "ppo_atari_lstm" else 4


def shrink(gray: np.ndarray) -> np.ndarray:
    """A 210x160 grayscale screen as the Atari details want it: 84x84, OpenCV's area
    interpolation."""
    import cv2

    return cv2.resize(gray, (84, 84), interpolation=cv2.INTER_AREA)


def assert_frames_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    difference = np.abs(actual.astype(np.int16) - expected.astype(np.int16))
    worst = int(difference.max())
    assert (worst <= GRAY_LEVELS), (f"{what}: {np.mean(difference > GRAY_LEVELS):.2%} of the "
                                    f"pixels differ by more than {GRAY_LEVELS} gray level(s), "
                                    f"by up to {worst}")


@dataclass
class Frame:
    """One emulated frame: the name of the action the emulator was asked for ("start" marks a new
    game instead), the reward it paid, the lives after it, and its grayscale screen."""
    action: str
    reward: float
    lives: int
    gray: np.ndarray | None


class FrameLog:
    """Stands in for an ale-py AtariEnv's emulator (`env.unwrapped.ale`) and notes every frame it
    runs and every new game; everything else goes to the emulator unchanged. Every wrapper of the
    scripts sits above AtariEnv, whose frames all pass through `ale.act`, one call per frame."""

    def __init__(self, ale):
        self._ale = ale
        self.frames: list[Frame] = []

    def act(self, action, *args):
        reward = self._ale.act(action, *args)
        self.frames.append(Frame(action.name, reward, self._ale.lives(),
                                 self._ale.getScreenGrayscale()))
        return reward

    def reset_game(self):
        self._ale.reset_game()
        self.frames.append(Frame("start", 0.0, self._ale.lives(), None))

    def __getattr__(self, name):
        return getattr(self._ale, name)

    def take(self) -> list[Frame]:
        frames, self.frames = self.frames, []
        return frames


def log_frames(envs: gym.vector.SyncVectorEnv) -> FrameLog:
    """Put a FrameLog under the first game of a script's vector env, before its first reset."""
    game = envs.envs[0].unwrapped
    game.ale = FrameLog(game.ale)
    return game.ale


@dataclass
class Played:
    """What the emulator ran during one call of the vector env, kept small: the actions of its
    frames, their rewards and lives, and the frames an observation can be made of: `pooled_after_4`
    from the 3rd and 4th frames (None unless 4 frames ran before any new game), `pooled_last` from
    the last two frames, `last` the last frame alone."""
    actions: list[str]
    rewards: list[float]
    lives: list[int]
    pooled_after_4: np.ndarray | None
    pooled_last: np.ndarray | None
    last: np.ndarray | None

    @classmethod
    def of(cls, frames: list[Frame]) -> "Played":
        screens = [frame.gray for frame in frames]
        first_four = len(screens) >= 4 and all(screen is not None for screen in screens[:4])
        last_two = len(screens) >= 2 and all(screen is not None for screen in screens[-2:])
        return cls([f.action for f in frames], [f.reward for f in frames],
                   [f.lives for f in frames],
                   shrink(np.maximum(screens[2], screens[3])) if first_four else None,
                   shrink(np.maximum(screens[-2], screens[-1])) if last_two else None,
                   shrink(screens[-1]) if screens and screens[-1] is not None else None)


@dataclass
class Step:
    """One step of the vector env: what the agent got back, and what the emulator ran meanwhile."""
    action: int
    obs: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    final_obs: np.ndarray | None
    games: list
    played: Played


@dataclass
class Play:
    """A recorded play (ale_play): the game's action names, its sticky-action probability, the first
    observation and what the seeded reset ran, then every step."""
    meanings: list[str]
    repeat_action_probability: float
    first_obs: np.ndarray
    reset: Played
    steps: list[Step] = field(default_factory=list)


@functools.cache
def ale_play(script_name: str, env_id: str, seed: int = 1, extra_steps: int = 8) -> Play:
    """Random play through `script.make_envs(env_id, 1)` as main() builds it (a SyncVectorEnv with
    SAME_STEP autoreset, the game wrapped as in training) with a FrameLog under the game, from the
    seeded reset to the end of the first game and `extra_steps` steps into the next. Played once,
    for every test that reads it."""
    script = ale_script(script_name)
    envs = script.make_envs(env_id, 1)
    log = log_frames(envs)
    meanings = envs.envs[0].unwrapped.get_action_meanings()
    obs, _ = envs.reset(seed=seed)
    play = Play(meanings, log.getFloat("repeat_action_probability"), obs[0].copy(),
                Played.of(log.take()))
    rng = np.random.default_rng(seed)
    steps_left = None
    while steps_left != 0:
        action = int(rng.integers(len(meanings)))
        obs, reward, terminated, truncated, infos = envs.step(np.array([action]))
        ended = bool(terminated[0] or truncated[0])
        play.steps.append(Step(action, obs[0].copy(), float(reward[0]), bool(terminated[0]),
                               bool(truncated[0]), infos["final_obs"][0].copy() if ended else None,
                               [(0, *game) for game in finished_episodes(infos)],
                               Played.of(log.take())))
        if steps_left is not None:
            steps_left -= 1
        elif play.steps[-1].games or len(play.steps) == 3000:
            steps_left = extra_steps
    envs.close()
    assert any(step.games for step in play.steps), "no game ended in 3,000 steps"
    return play


def reset_actions(meanings: list[str]) -> list[str]:
    """What the scripts are documented to play after a reset's no-ops: FIRE for a step (4 frames),
    then action 2 for a step, in games that have FIRE; nothing in the others."""
    return ["FIRE"] * 4 + [meanings[2]] * 4 if "FIRE" in meanings else []


def no_ops_of_a_new_game(actions: list[str], meanings: list[str]) -> int:
    """The number of no-op frames of a game start; `actions` must be "start", one or more NOOP
    frames, then reset_actions(meanings)."""
    tail = reset_actions(meanings)
    assert actions[0] == "start" and actions[len(actions) - len(tail):] == tail, actions
    no_ops = actions[1:len(actions) - len(tail)]
    assert no_ops and no_ops == ["NOOP"] * len(no_ops), actions
    return len(no_ops)


def kind_of(step: Step, play: Play) -> str:
    """"step", "life" (a life was lost, and the same game goes on after a reset) or "game" (the game
    is over and a new one started), from the emulator's log alone, checking on the way that the step
    played its action for 4 frames (fewer only where the game ended within them), then the reset the
    scripts document: after a lost life EpisodicLife's no-op step, then reset_actions."""
    actions, own = step.played.actions, play.meanings[step.action]
    if "start" in actions:
        before = actions.index("start")
        assert 1 <= before <= 4 and actions[:before] == [own] * before, actions
        no_ops_of_a_new_game(actions[before:], play.meanings)
        return "game"
    assert actions[:4] == [own] * 4, actions
    if len(actions) == 4:
        return "step"
    assert actions[4:] == ["NOOP"] * 4 + reset_actions(play.meanings), actions
    return "life"


def reset_part(step: Step, kind: str) -> list[str]:
    """The actions of the reset a step of that kind ended with: after its own frames."""
    actions = step.played.actions
    return actions[actions.index("start"):] if kind == "game" else actions[4:]


def first_frame_of_a_game(played: Played, meanings: list[str]) -> np.ndarray:
    """A new game's first observed frame: with FIRE, the max of the last two frames of the step of
    action 2; without, the last no-op frame alone, as the original NoopResetEnv gives it (there is
    no earlier frame of that game to pool it with)."""
    return played.pooled_last if reset_actions(meanings) else played.last


def expected_observations(play: Play, frames: int):
    """For each step of `play`, (the expected final_obs or None, the expected obs), stacks of
    `frames` frames built from the emulator's raw frames alone: a step's new frame is the max of its
    3rd and 4th frames, appended last, the oldest dropped; after any reset the stack holds the
    reset's frame `frames` times (the original FrameStack's fill). The final observation of a game
    is None: gymnasium's AtariPreprocessing stops at the game's end within the 4 frames, and no one
    acts on it."""
    stack = [first_frame_of_a_game(play.reset, play.meanings)] * frames
    for step in play.steps:
        kind, final = kind_of(step, play), None
        if kind != "game":
            stack = stack[1:] + [step.played.pooled_after_4]
            final = np.stack(stack)
        if kind == "life":
            stack = [step.played.pooled_last] * frames
        elif kind == "game":
            stack = [first_frame_of_a_game(step.played, play.meanings)] * frames
        yield (None if kind == "step" else final), np.stack(stack)


SHORT_GAMES_ID = "ObservationTestShortBreakout-v0"


def register_short_games() -> None:
    """Breakout cut off after 48 frames: a new game every few steps, without reloading the ROM (0.3
    s here) as a seeded reset does."""
    if SHORT_GAMES_ID not in gym.registry:
        gym.register(id=SHORT_GAMES_ID, entry_point="ale_py.env:AtariEnv",
                     kwargs={"game": "breakout", "repeat_action_probability": 0.0,
                             "max_num_frames_per_episode": 48})


@pytest.fixture(params=ALE_SCRIPTS)
def ale_script_name(request) -> str:
    return request.param


@pytest.fixture(scope="module", autouse=True)
def forget_the_plays_afterwards():
    """ale_play's recordings (about 100 MB of frames) are not kept past this file."""
    yield
    ale_play.cache_clear()


# --------------------------------------------------------------------------------------------------
# Helpers: envpool's games replayed on ale-py's emulator
# --------------------------------------------------------------------------------------------------


class EmulatorReplay:
    """Replays an envpool Atari game on ale-py's emulator (no preprocessing, one frame per act, no
    sticky actions) and says what each step should return.

    envpool's no-ops come from its own generator, so at each reset every count it could have drawn
    is tried (0-29 no-op frames then one FIRE frame in games with FIRE, 1-30 no-op frames in the
    others: envpool's reset) and those whose frame matches envpool's are kept as candidates. Several
    can match (Breakout's screen stands still until the ball is launched): the replay goes on with
    the first, and on a mismatch tries the others from the reset on; it fails only when none
    reproduces what envpool returned."""

    def __init__(self, game_id: str):
        import ale_py

        gym.register_envs(ale_py)
        self.env = gym.make(game_id, frameskip=1, repeat_action_probability=0.0)
        self.env.reset(seed=0)
        self.ale = self.env.unwrapped.ale
        self.actions = self.ale.getMinimalActionSet()
        self.fire = ale_py.Action.FIRE if ale_py.Action.FIRE in self.actions else None
        self.candidates, self.history = [], []

    def reset(self, new_game: bool, observed: np.ndarray) -> None:
        """envpool reset its game (a new one, or the same one after a lost life) and shows
        `observed`."""
        if new_game:
            self.ale.reset_game()
        state, self.candidates, self.history = self.ale.cloneState(), [], []
        for no_ops in range(31):
            if no_ops > 0:
                self.ale.restoreState(state)
                self.ale.act(self.actions[0])
                state = self.ale.cloneState()
            if self.fire is not None:
                self.ale.act(self.fire)
            elif no_ops == 0:
                continue
            if (np.abs(shrink(self.ale.getScreenGrayscale()).astype(np.int16) - observed).max()
                <= GRAY_LEVELS):
                self.candidates.append(self.ale.cloneState())
            self.ale.restoreState(state)
        assert self.candidates, ("no reset of 0-30 no-op frames (and FIRE) shows envpool's "
                                 "first frame")
        self.ale.restoreState(self.candidates[0])

    def _step(self, action: int) -> tuple[np.ndarray | None, float, int, bool]:
        screens, reward = [], 0.0
        for _ in range(4):
            reward += self.ale.act(self.actions[action])
            screens.append(self.ale.getScreenGrayscale())
            if self.ale.game_over():
                break
        frame = shrink(np.maximum(screens[-2], screens[-1])) if len(screens) == 4 else None
        return frame, reward, self.ale.lives(), self.ale.game_over()

    @staticmethod
    def _agrees(result, observed) -> bool:
        (frame, reward, lives, over), (newest, observed_reward, observed_lives,
                                       observed_over) = result, observed
        return (reward == observed_reward and lives == observed_lives and over == observed_over
                and (over or np.abs(frame.astype(np.int16) - newest).max() <= GRAY_LEVELS))

    def step(self, action: int, newest: np.ndarray, reward: float, lives: int, game_over: bool):
        """Play `action`, for which envpool returned `newest` (its newest frame), `reward` (its
        info["reward"]), `lives` and `game_over` (its info["terminated"]). Returns the replay's
        (frame, reward, lives, game over), switching to another candidate where that reproduces
        envpool's game."""
        observed = (newest, reward, lives, game_over)
        self.history.append((action, observed))
        result = self._step(action)
        if self._agrees(result, observed):
            return result
        first = result
        for candidate in self.candidates[1:]:
            self.ale.restoreState(candidate)
            for past_action, past in self.history:
                result = self._step(past_action)
                if not self._agrees(result, past):
                    break
            else:
                self.candidates = [candidate]
                return result
        raise AssertionError(f"no replay reproduces envpool's step {len(self.history)} after its "
                             f"last reset: envpool {reward=}, {lives=}, {game_over=}; the "
                             f"replay {first[1:]}")


# --------------------------------------------------------------------------------------------------
# Atari through ale-py: the observations rebuilt from the emulator's raw frames
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ALE_IDS)
def test_every_step_plays_its_action_for_four_emulator_frames_and_v5_keeps_sticky_actions(
        ale_script_name, env_id):
    """[Atari 2] A step is 4 frames of the game, for NoFrameskip-v4 and v5 ids alike (the scripts
    make v5 games with frameskip=1 and skip frames themselves: 16 frames, or 1, would fail here),
    each frame asked for the step's action; the sticky actions stay the id's (0.25 for v5, none for
    v4). Counted at the emulator, frame by frame, over a whole random game and the start of the
    next."""
    play = ale_play(ale_script_name, env_id)
    kinds = [kind_of(step, play) for step in play.steps]  # each checks its step's frames
    assert {"step", "life", "game"} <= set(kinds)
    assert play.repeat_action_probability == (0.25 if env_id.endswith("-v5") else 0.0)


@pytest.mark.parametrize("env_id", ALE_IDS)
def test_each_new_frame_is_the_max_of_the_last_two_emulator_frames_in_grayscale_at_84x84(
        ale_script_name, env_id):
    """[Atari 2, 5] The newest frame of every observation is, pixel for pixel, the 84x84 area resize
    of the max of the 3rd and 4th frames the emulator ran in that step, in ALE's grayscale; after a
    reset, of its last frames (first_frame_of_a_game). A frame that is only the last of the four
    (ALE skipping the frames itself) differs wherever a sprite flickers: in 0.3% of Breakout's
    pixels."""
    script = ale_script(ale_script_name)
    play = ale_play(ale_script_name, env_id)
    assert (play.first_obs.shape == (frames_per_observation(script), 84, 84)
            and play.first_obs.dtype == np.uint8)
    assert_frames_close(play.first_obs[-1], first_frame_of_a_game(play.reset, play.meanings),
                        "first observation")
    for t, (step, (final, expected)) in enumerate(zip(play.steps, expected_observations(play, 1))):
        if final is not None:
            assert_frames_close(step.final_obs[-1], final[-1], f"final observation of step {t}")
        assert_frames_close(step.obs[-1], expected[-1], f"observation of step {t}")


@pytest.mark.parametrize("env_id", ALE_IDS)
def test_the_stack_holds_the_last_four_frames_newest_last_and_moves_by_one_each_step(
        ale_script_name, env_id):
    """[Atari 7] Each observation is the game's last 4 frames, oldest first and newest last, moving
    by one frame per step; after every reset (a new game, or the same game after a lost life) it
    holds the reset's frame 4 times, as the original FrameStack does. The LSTM variant observes the
    newest frame alone, (1, 84, 84). Every stack is rebuilt from the emulator's raw frames
    (expected_observations), so a reversed stack fails at the first step that moves, not only where
    two frames happen to differ."""
    script = ale_script(ale_script_name)
    play = ale_play(ale_script_name, env_id)
    frames = frames_per_observation(script)
    for t, (step, (final, expected)) in enumerate(zip(play.steps,
                                                      expected_observations(play, frames))):
        if final is not None:
            assert_frames_close(step.final_obs, final, f"final observation of step {t}")
        assert_frames_close(step.obs, expected, f"observation of step {t}")


@pytest.mark.parametrize("env_id", [ALE_IDS[0], NO_FIRE_ID])
def test_every_reset_presses_fire_then_action_2_in_games_with_fire_and_nothing_in_others(
        ale_script_name, env_id):
    """[Atari 4] Every reset, a game's start as well as the one after each lost life, ends with FIRE
    for a step (4 frames) and then action 2 for a step in a game that has FIRE, as the original
    FireResetEnv does; a game without FIRE (Asterix) ends it with no-ops. Read from the emulator's
    own log."""
    play = ale_play(ale_script_name, env_id)
    kinds = [kind_of(step, play) for step in play.steps]
    assert "life" in kinds and "game" in kinds
    resets = [play.reset.actions] + [reset_part(step, kind) for step, kind in zip(play.steps, kinds)
                                     if kind != "step"]
    for actions in resets:
        if env_id == NO_FIRE_ID:
            assert ("FIRE" not in play.meanings and "FIRE" not in actions
                    and actions[-1] == "NOOP"), actions
        else:
            assert actions[-8:] == ["FIRE"] * 4 + [play.meanings[2]] * 4, actions


@pytest.mark.parametrize("env_id", [ALE_IDS[0], ALE_IDS[1], NO_FIRE_ID])
def test_a_lost_life_ends_the_training_episode_and_the_same_game_goes_on(ale_script_name, env_id):
    """[Atari 3] terminated is set exactly when a step loses a life that is not the last one (lives
    counted by the emulator) or ends the game; after a lost life the reset takes one no-op step and
    the same game goes on (no new game in the emulator); a game is reported (finished_episodes) only
    when it is over."""
    play = ale_play(ale_script_name, env_id)
    lives, lost_lives = play.reset.lives[-1], 0
    for t, step in enumerate(play.steps):
        kind = kind_of(step, play)
        lost_a_life = kind != "game" and 0 < step.played.lives[3] < lives
        assert step.terminated == (lost_a_life or kind == "game"), t
        assert (kind == "life") == lost_a_life, t
        assert bool(step.games) == (kind == "game"), t
        lost_lives += lost_a_life
        lives = step.played.lives[-1]
    assert lost_lives >= 2


@pytest.mark.parametrize("env_id", [ALE_IDS[0], ALE_IDS[1], NO_FIRE_ID])
def test_rewards_are_clipped_to_their_sign_and_the_logged_score_is_the_whole_games_raw_score(
        ale_script_name, env_id):
    """[Atari 6] Each step's training reward is the sign of what its 4 frames paid; the score and
    length that finished_episodes reports (RecordEpisodeStatistics below the lives and the clipping)
    are the whole game's: the raw rewards of every frame after the start's no-ops, over all the
    game's lives and reset steps, and the number of its steps of 4 frames. Asterix pays 50 a reward,
    so a score summed from clipped rewards is 50 times too small."""
    play = ale_play(ale_script_name, env_id)
    # "start" and the no-ops: not counted
    start = no_ops_of_a_new_game(play.reset.actions, play.meanings) + 1
    rewards, frames, games = play.reset.rewards[start:], len(play.reset.actions) - start, []
    for t, step in enumerate(play.steps):
        kind = kind_of(step, play)
        own = step.played.actions.index("start") if kind == "game" else 4  # the step's own frames
        assert step.reward == np.sign(sum(step.played.rewards[:own])), t
        rewards, frames = rewards + step.played.rewards[:own], frames + own
        # the rest of the step's frames are a reset's, part of the game unless a new one began
        start = own
        if kind == "game":
            games.append((0, sum(rewards), math.ceil(frames / 4)))
            assert step.games == [games[-1]], t
            start += no_ops_of_a_new_game(step.played.actions[own:], play.meanings) + 1
            rewards, frames = [], 0
        rewards, frames = (rewards + step.played.rewards[start:],
                           frames + len(step.played.actions) - start)
    assert games
    if env_id == NO_FIRE_ID:
        assert games[0][1] >= 100 and games[0][1] % 50 == 0


def test_games_start_after_1_to_30_no_op_frames_drawn_at_random(ale_script_name):
    """[Atari 1] 30 game starts through the script's factory, on a Breakout cut off after 48 frames
    (register_short_games) so that games start often: each starts with 1 to 30 no-op frames, counted
    at the emulator, then FIRE and action 2. The counts vary and reach both ends of the range: with
    30 uniform draws from 1-30, a maximum under 25 or a minimum over 6 each has odds of 0.1%, while
    a noop_max of 10, 20 or 60 fails. (The seed fixes the draws: the outcome is the same every
    run.)"""
    script = ale_script(ale_script_name)
    register_short_games()
    envs = script.make_envs(SHORT_GAMES_ID, 1)
    log = log_frames(envs)
    meanings = envs.envs[0].unwrapped.get_action_meanings()
    envs.reset(seed=3)
    starts, rng = [[frame.action for frame in log.take()]], np.random.default_rng(3)
    while len(starts) < 30:
        _, _, terminated, truncated, _ = envs.step(rng.integers(4, size=1))
        actions = [frame.action for frame in log.take()]
        if "start" in actions:
            assert truncated[0] or terminated[0]
            starts.append(actions[actions.index("start"):])
    envs.close()
    counts = [no_ops_of_a_new_game(actions, meanings) for actions in starts]
    assert 1 <= min(counts) <= 6 and 25 <= max(counts) <= 30, counts
    assert len(set(counts)) >= 12, counts


# --------------------------------------------------------------------------------------------------
# Atari through ale-py: the same games on ale-py's own preprocessing, AtariVectorEnv
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id, game", [(ALE_IDS[0], "breakout"), (NO_FIRE_ID, "asterix")])
def test_frames_rewards_and_lives_match_ale_py_own_preprocessing(ale_script_name, env_id, game):
    """Farama's C++ implementation of the Atari preprocessing, ale_py.vector_env.AtariVectorEnv
    (ale-py >= 0.10), replays the game of ale_play with the same actions: 4 frames a step and the
    max of the last two, grayscale, 84x84 area resize, a stack of 4 (1 for the LSTM), rewards
    unclipped, lost lives reported without a reset (life_loss_info). Compared to the end of the
    game: every observation (within GRAY_LEVELS, for the resize kernels), every training reward (the
    sign of the reference's), every terminated flag, and the logged score and length (the sum of the
    reference's rewards and its number of steps).

    What differs by design is played on the reference instead of compared: its reset presses FIRE
    for one frame and then draws 0-29 no-ops from its own generator, where the scripts draw 1-30
    from gymnasium's and then press FIRE and action 2 for a step each. So the reference, its FIRE
    reset off, is reset (unseeded, which is fast) until its no-op count is the script's, then
    stepped with FIRE and 2; after a lost life it is stepped with the no-op (and FIRE and 2) that
    EpisodicLife and FireReset document, where its own episodic_life would start over with new
    random no-ops. Its stack starts from zeros, not from the first frame: the expected stacks are
    built from its newest frames. v5 ids are left out: their sticky actions draw from each
    implementation's generator, so the games part within a few frames (ale_play's tests cover
    them)."""
    script = ale_script(ale_script_name)
    vector_env = pytest.importorskip("ale_py.vector_env")
    play = ale_play(ale_script_name, env_id)
    frames = frames_per_observation(script)
    reference = vector_env.AtariVectorEnv(
        game, 1, frameskip=4, maxpool=True, grayscale=True, img_height=84, img_width=84,
        stack_num=frames, noop_max=30, use_fire_reset=False, episodic_life=False,
        life_loss_info=True, reward_clipping=False, repeat_action_probability=0.0,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    no_ops = no_ops_of_a_new_game(play.reset.actions, play.meanings)
    obs, info = reference.reset(seed=1)
    for _ in range(500):
        if info["episode_frame_number"][0] == no_ops:
            break
        obs, info = reference.reset()
    else:
        pytest.fail(f"the reference never drew {no_ops} no-ops")
    score, length = 0.0, 0

    def step_reference(action: int):
        nonlocal score, length
        result = reference.step(np.array([action]))
        score, length = score + float(result[1][0]), length + 1
        return result

    fire = [1, 2] if "FIRE" in play.meanings else []
    for action in fire:
        obs, *_ = step_reference(action)
    stack = [obs[0, -1]] * frames
    assert_frames_close(play.first_obs, np.stack(stack), "first observation")
    for t, step in enumerate(play.steps):
        obs, reward, terminated, _, _ = step_reference(step.action)
        assert step.reward == np.sign(reward[0]), t
        assert step.terminated == terminated[0], t
        if step.games:
            assert step.games == [(0, score, length)]
            break
        stack = stack[1:] + [obs[0, -1]]
        assert_frames_close(step.final_obs if step.terminated else step.obs,
                            np.stack(stack), f"step {t}")
        if step.terminated:  # a lost life: EpisodicLife's no-op step, then FireReset's steps
            for action in [0] + fire:
                obs, reward, terminated, *_ = step_reference(action)
                assert not terminated[0]
            stack = [obs[0, -1]] * frames
            assert_frames_close(step.obs, np.stack(stack), f"reset after step {t}")
    else:
        pytest.fail("the game did not end")
    reference.close()


# --------------------------------------------------------------------------------------------------
# Atari through envpool
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game", ["Breakout", "Asterix"])
def test_envpool_frames_rewards_and_lives_match_a_replay_on_the_emulator(game):
    """ppo_atari_envpool.py's pool (its make_envs, one game), 300 random steps, replayed on ale-py's
    emulator (EmulatorReplay). At every step: [Atari 2, 5] the newest frame is the 84x84 area resize
    of the max of the step's last two grayscale frames (within GRAY_LEVELS); [Atari 7] the stack is
    the previous one moved by one, newest last, and a new game's first stack is its first frame 4
    times (after a lost life envpool does not refill it: a difference from the ale-py scripts that
    docs/ppo_atari_envpool.md lists); [Atari 6] the reward is the sign of info["reward"], and that
    is the frames' raw reward (Asterix: 50); [Atari 3] terminated exactly on a lost life, after
    which the same game goes on (the replay continues its emulator, no new game), and on the game's
    end; [Atari 4] every reset ends with a FIRE frame in Breakout and none in Asterix (no other
    reset matches). envpool's reset step after a done step (which ignores its action) is matched as
    a reset. Not compared: the no-op counts, drawn from envpool's own generator (the candidates
    cover them all), and sticky actions (none: repeat_action_probability=0, as the script sets)."""
    pytest.importorskip("envpool")
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    script = importlib.import_module("ppo.ppo_atari_envpool")
    pool = script.make_envs(f"{game}-v5", 1, seed=3)
    replay = EmulatorReplay(f"ALE/{game}-v5")
    obs, info = pool.reset()
    assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
    assert all(np.array_equal(frame, obs[0, -1]) for frame in obs[0])
    replay.reset(new_game=True, observed=obs[0, -1])
    rng = np.random.default_rng(3)
    previous, reset_next, new_game_next = obs[0], False, False
    lives, lost_lives, games, best_reward = int(info["lives"][0]), 0, 0, 0.0
    for t in range(300):
        action = int(rng.integers(pool.single_action_space.n))
        obs, reward, terminated, truncated, info = pool.step(np.array([action]))
        newest = obs[0, -1]
        if reset_next:
            replay.reset(new_game_next, newest)
            assert reward[0] == 0 and info["reward"][0] == 0
            if new_game_next:
                assert all(np.array_equal(frame, newest) for frame in obs[0]), t
            else:
                assert np.array_equal(obs[0, :-1], previous[1:]), t
            lives, previous, reset_next = int(info["lives"][0]), obs[0], False
            continue
        frame, raw_reward, replay_lives, over = replay.step(
            action, newest, float(info["reward"][0]), int(info["lives"][0]),
            bool(info["terminated"][0]))
        assert reward[0] == np.sign(info["reward"][0]), t
        if not over:
            assert_frames_close(newest, frame, f"step {t}")
            assert np.array_equal(obs[0, :-1], previous[1:]), t
        lost_a_life = 0 < replay_lives < lives
        assert terminated[0] == (lost_a_life or over), t
        lost_lives, games, best_reward = (lost_lives + lost_a_life, games + over,
                                          max(best_reward, raw_reward))
        lives, previous = replay_lives, obs[0]
        reset_next, new_game_next = bool(terminated[0] or truncated[0]), over or bool(truncated[0])
    pool.close()
    assert lost_lives >= 2 and games >= 1
    assert best_reward == (50 if game == "Asterix" else 1)


# --------------------------------------------------------------------------------------------------
# Procgen
# --------------------------------------------------------------------------------------------------


def procgen_frames(
        game: str, options: dict, actions: np.ndarray, seed: int) -> tuple[list, list, list]:
    """Frames, rewards and episode starts of procgen's own ProcgenGym3Env made with `options`."""
    from procgen import ProcgenGym3Env

    games = ProcgenGym3Env(num=actions.shape[1], env_name=game, rand_seed=seed, **options)
    _, obs, _ = games.observe()
    frames, rewards, firsts = [obs["rgb"]], [], []
    for action in actions:
        games.act(action.astype(np.int32))
        reward, obs, first = games.observe()
        frames.append(obs["rgb"])
        rewards.append(reward)
        firsts.append(first)
    games.close()
    return frames, rewards, firsts


@pytest.mark.parametrize("options", [
    dict(distribution_mode="easy", num_levels=0, start_level=0),
    dict(distribution_mode="hard", num_levels=1, start_level=42),
], ids=["defaults", "hard-level-42"])
def test_procgen_observations_are_the_games_own_frames_with_the_mode_and_levels_asked_for(options):
    """The script's make_envs with these settings gives, step for step, the very (64, 64, 3) uint8
    RGB frames, rewards and episode ends (as terminated, never truncated) of procgen's
    ProcgenGym3Env made directly with them and the same seed: nothing transforms the frames, and the
    distribution mode, the number of levels and the first level reach Procgen. The control, so that
    a setting lost on the way could not pass unseen: procgen made with any one of them changed gives
    other frames."""
    script = importlib.import_module("ppo.ppo_procgen")
    if procgen_games.ProcgenGym3Env is None:
        pytest.skip("procgen is not installed: pip install -e '.[procgen]'")
    game, seed = "starpilot", 7
    actions = np.random.default_rng(0).integers(15, size=(80, 2))
    envs = script.make_envs(game, 2, **options)
    obs, _ = envs.reset(seed=seed)
    frames, rewards, firsts = procgen_frames(game, options, actions, seed)
    assert obs.shape == (2, 64, 64, 3) and obs.dtype == np.uint8
    np.testing.assert_array_equal(obs, frames[0])
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, _ = envs.step(action)
        np.testing.assert_array_equal(obs, frames[t + 1], err_msg=f"step {t}")
        np.testing.assert_array_equal(reward, rewards[t])
        np.testing.assert_array_equal(terminated, firsts[t])
        assert not truncated.any()
    envs.close()
    changes = ([dict(distribution_mode="hard")] if options["distribution_mode"] == "easy" else
               [dict(distribution_mode="easy"), dict(start_level=43), dict(num_levels=0)])
    for change in changes:
        other, _, _ = procgen_frames(game, {**options, **change}, actions, seed)
        assert any(not np.array_equal(a, b) for a, b in zip(other, frames)), change


def test_procgen_acts_on_raw_frames_with_rewards_scaled_by_the_return_std_restarted_each_episode(
        workdir, monkeypatch, one_torch_thread):
    """[Procgen 2] A short run of main() on stand-in games whose rewards are known (FakeGames of
    test_ppo_procgen.py: 1 a step, 10 at an episode's end, every 6 steps), with frames that differ
    from game to game and step to step: what GAE receives is each raw reward divided by the standard
    deviation of the discounted return (gamma 0.999, restarted after every episode's end) and
    clipped to +-reward_clip (3 here: it bites in the first steps), recomputed from the raw rewards
    (scaled_rewards); the agent acts on the games' own frames, untouched; and the run's distribution
    mode and level settings reach the games' constructor, from main's arguments."""
    from test_ppo_procgen import FakeGames

    script = importlib.import_module("ppo.ppo_procgen")
    made = []

    class RecordingGames(FakeGames):
        def __init__(self, num, env_name, rand_seed=None, **options):
            made.append(dict(env_name=env_name, **options))
            super().__init__(num, env_name, rand_seed=rand_seed, **options)

        def observe(self):
            reward, obs, first = super().observe()
            shift = (np.arange(self.num, dtype=np.uint8)[:, None, None, None] * 40
                     + np.uint8(7 * self.t.sum() % 50))
            return reward, {"rgb": obs["rgb"] + shift}, first

    monkeypatch.setattr(procgen_games, "ProcgenGym3Env", RecordingGames)
    outputs = record_outputs(monkeypatch, procgen_games.Games)
    gae_rewards = record_calls(monkeypatch, script, "compute_gae",
                               lambda rewards, *rest: rewards.copy())
    acted = record_calls(monkeypatch, script.Agent, "get_action_and_value",
                         lambda agent, obs, action=None: obs.clone() if action is None else None)
    args = script.Args(env_id="bigfish", distribution_mode="hard", num_levels=5, start_level=9,
                       num_envs=2, num_steps=32, num_minibatches=2, update_epochs=1,
                       reward_clip=3.0, total_timesteps=64, cuda=False)
    script.main(args)
    assert made == [dict(env_name="bigfish", distribution_mode="hard", num_levels=5, start_level=9)]
    steps = [output for output in outputs if output[0] == "step"]
    assert len(steps) == args.num_steps
    rewards, dones = (np.array([output[2] for output in steps]),
                      np.array([output[3] for output in steps]))
    expected = scaled_rewards(rewards, dones, args.gamma, args.reward_clip, restart_after=True)
    np.testing.assert_allclose(gae_rewards[0], expected, rtol=1e-5, atol=1e-6)
    assert (np.any(np.abs(expected) == args.reward_clip)
            and np.any(np.abs(expected) < args.reward_clip))
    # what each step acted on
    frames = np.array([outputs[0][1]] + [output[1] for output in steps[:-1]])
    np.testing.assert_array_equal(np.array([obs.numpy() for obs in acted if obs is not None]),
                                  frames)


# --------------------------------------------------------------------------------------------------
# ppo_continuous_action.py
#
# Already covered by tests/test_ppo_continuous_action.py, so not repeated here: normalize_obs with
# given statistics, and its clip; --obs-clip reaching the trained agent; the return cut at
# terminations and not at truncations (RewardScaler alone, and what the training loop hands it);
# scaled rewards clipped to --reward-clip; actions clipped for the environment while the sample is
# stored; the logged return being the environment's. Added: the environments left raw by make_envs,
# and a training run's normalized observations and scaled rewards recomputed from the raw ones.
# --------------------------------------------------------------------------------------------------


def test_continuous_environments_are_left_raw_by_make_envs():
    """make_envs gives the environment's own observations and rewards: Pendulum-v1 (Box actions; its
    200-step time limit ends episodes on the way) through the script's factory and through gymnasium
    directly, SAME_STEP autoreset both, same seeds and actions: identical outputs. Normalization
    belongs to the agent, reward scaling to the training loop (docs/ppo_continuous_action.md)."""
    script = importlib.import_module("ppo.ppo_continuous_action")
    actions = np.random.default_rng(0).uniform(-2, 2, size=(450, 2, 1)).astype(np.float32)
    reference = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * 2,
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert_same_vector_env_outputs(script.make_envs("Pendulum-v1", 2), reference, actions)


def test_continuous_agent_acts_on_observations_normalized_by_everything_seen_so_far_and_clipped(
        workdir, monkeypatch, one_torch_thread):
    """[Continuous 6, 7] In a training run on TightBounds-v0 of test_ppo_continuous_action.py (raw
    observations around 5, std 2), every observation the agent acts on, and the same one stored for
    the update, is the raw one shifted by the mean and divided by the standard deviation of every
    raw observation the environments returned up to and including it (the first reset's and each
    step's; not the final observations of finished episodes, which no one acts on), then clipped to
    +-obs_clip (1 here, so that the clip bites). Recomputed from the raw observations with
    mean_and_var."""
    import test_ppo_continuous_action  # noqa: F401  (registers TightBounds-v0)

    script = importlib.import_module("ppo.ppo_continuous_action")
    outputs = record_outputs(monkeypatch, gym.vector.SyncVectorEnv)
    acted = record_calls(monkeypatch, script.Agent, "get_action", lambda agent, obs: obs.clone())
    stored = record_calls(monkeypatch, script.Agent, "get_action_and_value", the_whole_batch(128))
    args = script.Args(env_id="TightBounds-v0", num_envs=2, num_steps=64, num_minibatches=2,
                       update_epochs=1, total_timesteps=128, obs_clip=1.0, cuda=False)
    script.main(args)
    raw = np.array([output[1] for output in outputs])  # the reset's, then each step's: (65, 2, 3)
    expected = []
    for t in range(args.num_steps):
        mean, var = mean_and_var(raw[:t + 1].reshape(-1, raw.shape[-1]))
        expected.append(np.clip((raw[t] - mean) / np.sqrt(var + 1e-8), -args.obs_clip,
                                args.obs_clip))
    expected = np.array(expected)
    np.testing.assert_allclose(np.array([obs.numpy() for obs in acted]), expected,
                               rtol=1e-5, atol=1e-6)
    batch = next(obs for obs in stored if obs is not None).numpy()
    np.testing.assert_allclose(batch.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)
    assert 0.05 < np.mean(np.abs(expected) == args.obs_clip) < 0.95


class EndsBothWays(gym.Env):
    """Rewards of varying size and sign; an episode terminates at random (15% a step) unless the
    6-step time limit it is registered with cuts it first: both kinds of ends in a short run."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        reward = float(self.np_random.normal(2.0, 6.0))
        return np.zeros(2, np.float32), reward, bool(self.np_random.random() < 0.15), False, {}


ENDS_BOTH_WAYS_ID = "ObservationTestEndsBothWays-v0"
if ENDS_BOTH_WAYS_ID not in gym.registry:
    gym.register(id=ENDS_BOTH_WAYS_ID, entry_point=EndsBothWays, max_episode_steps=6)


def test_continuous_training_rewards_are_scaled_by_the_return_std_cut_only_at_terminations(
        workdir, monkeypatch, one_torch_thread):
    """[Continuous 8, 9] What GAE receives in a training run whose episodes terminate or are cut by
    a time limit: each raw reward divided by the standard deviation of the discounted return (gamma
    0.99, one set of statistics for both environments), the return cut at a termination (the
    terminal step's return is its own reward) and carried on across a truncation, then clipped to
    +-reward_clip (2 here, so that it bites). Recomputed from the raw rewards (scaled_rewards)."""
    script = importlib.import_module("ppo.ppo_continuous_action")
    outputs = record_outputs(monkeypatch, gym.vector.SyncVectorEnv)
    gae_rewards = record_calls(monkeypatch, script, "compute_gae",
                               lambda rewards, *rest: rewards.copy())
    args = script.Args(env_id=ENDS_BOTH_WAYS_ID, num_envs=2, num_steps=64, num_minibatches=2,
                       update_epochs=1, total_timesteps=128, reward_clip=2.0, cuda=False)
    script.main(args)
    steps = [output for output in outputs if output[0] == "step"]
    rewards = np.array([output[2] for output in steps])
    terminations, truncations = (np.array([output[i] for output in steps]) for i in (3, 4))
    assert terminations.sum() >= 5 and truncations.sum() >= 5
    expected = scaled_rewards(rewards, terminations.astype(float), args.gamma, args.reward_clip,
                              restart_after=False)
    np.testing.assert_allclose(np.concatenate(gae_rewards), expected, rtol=1e-5, atol=1e-6)
    assert 0 < np.mean(np.abs(expected) == args.reward_clip) < 0.5


# --------------------------------------------------------------------------------------------------
# ppo.py
# --------------------------------------------------------------------------------------------------


def test_ppo_environments_are_left_raw_by_make_envs():
    """docs/ppo.md lists no observation or reward processing: CartPole-v1 through the script's
    factory and through gymnasium directly (SAME_STEP autoreset both, same seeds and actions,
    episodes ending on the way) gives identical outputs."""
    script = importlib.import_module("ppo.ppo")
    actions = np.random.default_rng(0).integers(2, size=(300, 2))
    reference = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert_same_vector_env_outputs(script.make_envs("CartPole-v1", 2), reference, actions)


def test_ppo_agent_acts_on_and_learns_from_the_environments_own_observations_and_rewards(
        workdir, monkeypatch, one_torch_thread):
    """In a training run, the observations the agent acts on at each step and those stored for each
    update are the environments' own, as they returned them (as float32), and the rewards GAE
    receives are the raw ones: recorded at the vector env and compared."""
    script = importlib.import_module("ppo.ppo")
    outputs = record_outputs(monkeypatch, gym.vector.SyncVectorEnv)
    acted = record_calls(monkeypatch, script.Agent, "get_action", lambda agent, obs: obs.clone())
    stored = record_calls(monkeypatch, script.Agent, "get_action_and_value", the_whole_batch(128))
    gae_rewards = record_calls(monkeypatch, script, "compute_gae",
                               lambda rewards, *rest: rewards.copy())
    args = script.Args(env_id="CartPole-v1", num_envs=2, num_steps=64, num_minibatches=2,
                       update_epochs=1, total_timesteps=256, cuda=False)
    script.main(args)
    # the reset's, then each step's
    raw = np.array([output[1] for output in outputs], dtype=np.float32)
    np.testing.assert_array_equal(np.array([obs.numpy() for obs in acted]), raw[:128])
    batches = [obs.numpy() for obs in stored if obs is not None]
    np.testing.assert_array_equal(np.array(batches), raw[:128].reshape(2, 128, 4))
    np.testing.assert_array_equal(np.concatenate(gae_rewards),
                                  np.array([output[2] for output in outputs[1:]]))
