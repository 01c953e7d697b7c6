"""--export DIR: a saved agent and its evaluation, laid out as a model repository of the Hugging
Face hub: its weights and settings (model.pt, data only, which --evaluate DIR reads as a
checkpoint), the script that trained it and the command that trains it again, the packages'
versions, the evaluation's episodes, its video, and a model card (README.md) the hub reads."""

import glob
import json
import os
import shlex
import shutil
from dataclasses import fields, replace

import numpy as np

from ppo_utils import run_logs
from ppo_utils.checkpoint import MODEL_FILE, Checkpoint
from ppo_utils.exits import WrongInput
from ppo_utils.run_logs import command, software_versions, text_table

# An evaluation's settings, no training run's: left out of the command that trains it again.
EVALUATION_FLAGS = {"resume", "evaluate", "eval_episodes", "watch", "watch_fps", "export"}


def check_folder(folder: str) -> None:
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise WrongInput(f"--export {folder}: it exists and is not an empty folder: name a new one")


def training_command(args, checkpoint: Checkpoint) -> str:
    """The command that trains the agent again: the script, and each of the run's settings (as its
    checkpoint holds them) that is not at its default."""
    defaults, words = type(args)(), [f"python ppo/{args.variant}.py"]
    trained = {**vars(defaults), **checkpoint.args}
    for field in fields(args):
        value = trained[field.name]
        if field.name in EVALUATION_FLAGS or value == getattr(defaults, field.name):
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else f"--no-{flag[2:]}")
        else:
            values = value if isinstance(value, list) else [value]
            words += [flag, *(shlex.quote(str(item)) for item in values)]
    return " ".join(words)


def model_card(args, checkpoint: Checkpoint, mean: float, std: float, episodes: int) -> str:
    """README.md (model_card.md filled in): the hub's metadata, with the evaluation's mean return in
    its model-index, then how to evaluate, watch and train the agent again."""
    with open(os.path.join(os.path.dirname(__file__), "model_card.md")) as file:
        template = file.read()
    return template.format(
        env=json.dumps(args.env_id),  # YAML reads a JSON string: ALE/Pong-v5 stays one tag
        env_id=args.env_id, script=f"ppo/{args.variant}.py", variant=args.variant, mean=mean,
        std=std, episodes=episodes, seed=args.seed, global_step=checkpoint.global_step,
        run_name=checkpoint.run_name, command=training_command(args, checkpoint),
        versions=text_table("package", "version", software_versions(None)))


def export(folder: str, args, checkpoint: Checkpoint, scores: list[float],
           video_folder: str | None) -> None:
    """Write the folder: the checkpoint without what only a resumed run needs, the script, the
    evaluation, its first video and the model card."""
    os.makedirs(folder, exist_ok=True)
    replace(checkpoint, optimizer={}, processes=[]).write(os.path.join(folder, MODEL_FILE))
    if run_logs.script_as_run:  # not where main() was called from Python
        shutil.copy(run_logs.script_as_run, os.path.join(folder, f"{args.variant}.py"))
    mean, std = float(np.mean(scores)), float(np.std(scores))
    with open(os.path.join(folder, "evaluation.json"), "w") as file:
        json.dump({"env_id": args.env_id, "seed": args.seed, "returns": scores, "mean_return": mean,
                   "std_return": std, "global_step": checkpoint.global_step}, file, indent=1)
    videos = sorted(glob.glob(os.path.join(video_folder or "", "*.mp4"))) if video_folder else []
    if videos:
        shutil.copy(videos[0], os.path.join(folder, "replay.mp4"))
    with open(os.path.join(folder, "README.md"), "w") as file:
        file.write(model_card(args, checkpoint, mean, std, len(scores)))
    print(f"exported to {folder}/: evaluate it with: {command(args.variant, '--evaluate', folder)}")
