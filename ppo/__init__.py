"""Single-file PPO scripts. Each module in this folder is a complete, runnable training script;
the package exists only so that tests and tools can import their functions."""
