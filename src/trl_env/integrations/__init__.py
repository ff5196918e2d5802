"""Glue to other libraries.

TRL's GRPOTrainer (grpo.py, its options in options.py, its metrics in metrics.py), TRL's AsyncGRPOTrainer
(async_grpo/), OpenEnv servers (openenv.py, extra "openenv") and env libraries (textarena.py, reasoning_gym.py,
textworld.py, each an extra).
"""
