"""The TRL seam: rollouts in, TRL's batches out (make_rollout_func, EpisodeGRPOTrainer, the async worker, credit)."""
