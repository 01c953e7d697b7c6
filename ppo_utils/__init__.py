"""What every script of ppo/ imports beside its PPO: the run around it (the command line with
--resume and --evaluate, checkpoints, logs, stop signals, the environments it takes) and the helpers
of its family of environments, one concern a module, as CleanRL's scripts import cleanrl_utils."""
