"""--evaluate: a saved agent plays episodes, each score printed as it ends, then their mean; with
--watch in a window as it plays, with --export written out as a model folder."""

from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from ppo_utils import command_line, environments, model_folder, watching
from ppo_utils.checkpoint import Checkpoint, all_finite
from ppo_utils.exits import WrongInput


class Evaluation:
    """An evaluation: its device, videos' folder and seed, the saved agent (`load`), its episodes
    (`play`)."""

    def __init__(self, args, checkpoint: Checkpoint):
        command_line.check_args(args)
        if args.watch:
            watching.check_display()
        if args.export:
            model_folder.check_folder(args.export)
        if not all_finite(checkpoint.model):
            raise WrongInput(f"{args.evaluate!r} holds non-finite weights (NaN or infinite: the "
                             "run diverged): evaluate a checkpoint saved before it diverged")
        self.args, self.checkpoint, self.scores = args, checkpoint, []
        self.device = command_line.device(args)
        # What the scripts' make_envs take: whether the environments draw frames (filmed or shown),
        # and where the films go (None: none filmed).
        self.renders = args.capture_video or args.watch
        self.video_folder = f"videos/{checkpoint.run_name}-eval" if args.capture_video else None
        if self.renders:
            environments.render_off_screen(window=args.watch)
        # Seeds unlike any training seed: the scores come from episodes the agent never trained on.
        self.seed = args.seed + 100_000

    def load(self, agent: torch.nn.Module) -> torch.nn.Module:
        """The agent with the checkpoint's weights, on the device, its actions drawn from --seed."""
        agent.load_state_dict(self.checkpoint.model)
        agent.to(self.device).eval()
        torch.manual_seed(self.args.seed)
        return agent

    def play(self, envs: gym.vector.VectorEnv, policy: Callable, state=None,
             infos_too: bool = False) -> list[float]:
        """Play --eval-episodes episodes in `envs` with `policy(obs, done)` (`done`: the step before
        ended an episode), which returns the actions; a recurrent policy takes its `state` and
        returns the next with them; with `infos_too` it takes the infos (an action mask) too.
        Returns the scores."""
        obs, infos = envs.reset(seed=self.seed)
        window = self.window(envs) if self.args.watch else None
        done = np.zeros(envs.num_envs, dtype=bool)
        try:
            while len(self.scores) < self.args.eval_episodes:
                if window:
                    window.show(envs.render()[0])
                with torch.inference_mode():
                    if state is not None:
                        action, state = policy(obs, done, state)
                    else:
                        action = policy(obs, done, infos) if infos_too else policy(obs, done)
                obs, _, terminated, truncated, infos = envs.step(action)
                done = terminated | truncated
                for score, length in environments.finished_episodes(infos):
                    self.scores.append(score)
                    print(f"episode {len(self.scores)}: return {score:.1f} ({length} steps)")
        finally:
            if window:
                window.close()
            envs.close()
        print(f"{self.args.env_id}: mean return {np.mean(self.scores):.2f} +- "
              f"{np.std(self.scores):.2f} over {len(self.scores)} episodes")
        if self.video_folder:
            print(f"videos in {self.video_folder}/")
        if self.args.export:
            model_folder.export(self.args.export, self.args, self.checkpoint, self.scores,
                                self.video_folder)
        return self.scores

    def window(self, envs) -> watching.Window:
        """--watch's window, at --watch-fps or the environments' own frame rate; refused where
        the environments draw no frames."""
        try:
            frames = envs.render()
        except NotImplementedError:
            frames = None
        if not frames or frames[0] is None:
            envs.close()
            raise WrongInput(f"--watch shows the frames {self.args.env_id} draws, and it draws "
                             "none: score the agent without --watch")
        fps = self.args.watch_fps or envs.metadata.get("render_fps") or 30
        return watching.Window(f"{self.args.variant}.py --evaluate: {self.args.env_id}", fps)
