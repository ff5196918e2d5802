import trl_env


def test_public_api_is_pinned():
    assert sorted(trl_env.__all__) == sorted(
        [
            "Action",
            "Budgets",
            "ChatMLProcessor",
            "ConfigError",
            "Delta",
            "Ending",
            "Env",
            "EnvError",
            "FinishReason",
            "Generation",
            "GenerationRequest",
            "Generator",
            "Language",
            "PROCESSORS",
            "Processor",
            "ProcessorError",
            "Rollout",
            "Seed",
            "ServerError",
            "TransformersGenerator",
            "TrlEnvError",
            "Turn",
            "VLLMServerGenerator",
            "batch_rollout",
            "env_reward",
            "from_tokenizer",
            "get_processor",
            "make_rollout_func",
            "split_reasoning",
            "to_trl",
        ]
    )
    for name in trl_env.__all__:
        assert hasattr(trl_env, name)


def test_import_is_light():
    """``import trl_env`` (and what an env worker process imports) loads neither torch nor transformers.

    Each isolated env's worker process imports ``trl_env.rollout.isolation``; a torch import there costs seconds of CPU
    and hundreds of MB per worker. Only ``TransformersGenerator`` needs them, and it loads them when first used.
    """
    import subprocess
    import sys

    code = (
        "import sys, trl_env, trl_env.rollout.isolation, trl_env.train.grpo\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert trl_env.TransformersGenerator.__name__ == 'TransformersGenerator'\n"
        "assert 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
