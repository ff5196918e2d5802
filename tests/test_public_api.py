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
