"""Glue to other libraries: TRL's GRPOTrainer (grpo.py) and OpenEnv servers (openenv.py, extra "openenv")."""
