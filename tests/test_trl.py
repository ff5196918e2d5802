"""TRL glue: real GRPOTrainer steps on CPU with a multi-turn env; env tokens get no gradient; the row contract."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from datasets import Dataset
from helpers import GuessEnv, ScriptedEnv, grpo_config
from trl import GRPOTrainer

import trl_env.train.grpo as glue
from trl_env import ChatMLProcessor, ConfigError, Ending, env_reward, make_rollout_func


def test_grpo_trains_on_a_multi_turn_env_and_env_tokens_get_no_gradient(tmp_path, model, tokenizer):
    envs = []

    def factory():
        envs.append(ScriptedEnv())  # reward depends on the action, so GRPO groups have a spread
        return envs[-1]

    rollout_func = make_rollout_func(
        factory,
        ChatMLProcessor(system_prompt="Answer briefly."),
        max_turns=4,
        max_new_tokens=6,
        parse_truncated_turns=True,
    )
    seeds = [f'{{"n": 5, "deltas": ["level {i}", "try again", " 42\\n"]}}' for i in range(8)]
    dataset = Dataset.from_dict({"prompt": seeds})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=grpo_config(tmp_path),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    captured = []
    original = trainer._generate_and_score_completions

    def capture(inputs):
        output = original(inputs)
        captured.append(output)
        return output

    trainer._generate_and_score_completions = capture
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()

    assert trainer.state.global_step == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False)), "no weight changed"
    logged = [h for h in trainer.state.log_history if "env/turns_mean" in h]
    assert logged and max(h["env/turns_mean"] for h in logged) >= 3, "episodes must run 3+ turns"
    assert len(envs) == 2 * 4  # a fresh env per episode

    # The loss mask the trainer uses (completion_mask * tool_mask) has a 0 on every env token.
    batch = captured[0]
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    assert loss_mask.sum() < batch["completion_mask"].sum()  # env tokens were present and masked

    # Gradient of the loss w.r.t. the final hidden states (TRL fuses the lm head, so there are no logits to hook):
    # position t only feeds the prediction of token t+1, so it must be zero where that token is env text.
    holder = {}

    def keep_hidden(module, args, output):
        output.retain_grad()
        holder["hidden"] = output

    handle = model.model.norm.register_forward_hook(keep_hidden)
    try:
        model.train()
        loss = trainer.compute_loss(model, batch)
        loss.backward()
    finally:
        handle.remove()
    grad = holder["hidden"].grad.abs().sum(-1)  # (B, S)
    completion_len = batch["completion_ids"].size(1)
    grad = grad[:, grad.size(1) - 1 - completion_len : -1]  # position predicting completion token j
    learning = (batch["advantages"].view(-1) != 0).unsqueeze(1)  # rows with a zero advantage carry no gradient
    env_positions = (batch["completion_mask"] == 1) & (batch["tool_mask"] == 0) & learning
    model_positions = (loss_mask == 1) & learning
    assert env_positions.any() and model_positions.any()
    assert torch.all(grad[env_positions] == 0)
    assert torch.all(grad[model_positions] > 0)


def test_rollout_func_returns_one_valid_row_per_prompt_in_order(model, tokenizer):
    class Trainer:  # the attributes rollout_func reads; the real trainer is exercised above
        args = grpo_config("unused", max_completion_length=40)
        processing_class = tokenizer
        _metrics = defaultdict(lambda: defaultdict(list))  # as in GRPOTrainer

    Trainer.model = model
    Trainer.model_wrapped = model
    Trainer.accelerator = None
    seeds = ['{"n": 0, "deltas": ["dead"]}', '{"n": 2, "deltas": ["a", "b"]}']
    prompts = [s for s in seeds for _ in range(3)]
    from trl_env import TransformersGenerator

    gen = TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id)
    out = make_rollout_func(ScriptedEnv, ChatMLProcessor(), max_new_tokens=5, generator=gen)(prompts, Trainer())
    n = len(prompts)
    assert all(len(out[k]) == n for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward"))
    for ids, lps, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=False):
        assert len(ids) == len(lps) == len(mask) >= 1 and len(ids) <= 40
        assert all(isinstance(x, float) and math.isfinite(x) for x in lps)
    assert out["env_ending"][:3] == [Ending.ENV_DONE.value] * 3 and out["env_reward"][:3] == [None] * 3
    assert out["env_mask"][:3] == [[0]] * 3
    assert len({tuple(p) for p in out["prompt_ids"][3:]}) == 1
    assert env_reward(completions=[None] * n, env_reward=out["env_reward"]) == out["env_reward"]
    assert Trainer._metrics["eval"]["env/ending_env_done_rate"] == [0.5]  # the model is in eval mode here


def test_failed_episodes_are_masked_out_and_unscored():
    from trl_env import Rollout
    from trl_env.train.grpo import to_trl

    failed = Rollout.single("s", [1], [5, 6], [-0.1, 0.0], [1, 0], (), None, Ending.ERROR, error="boom")
    out = to_trl([failed])
    assert out["env_mask"] == [[0, 0]] and out["env_reward"] == [None] and out["env_ending"] == ["error"]


def test_unsupported_trl_fails_naming_installed_and_required_versions(monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.10.0")
    with pytest.raises(ConfigError, match=r"trl 1\.10\.0 is installed, trl_env needs trl>=1\.16\.0"):
        make_rollout_func(GuessEnv, ChatMLProcessor())


def test_system_prompt_option_replaces_the_processors_and_is_refused_when_impossible():
    class Plain:
        def init_system_input(self, prompt):
            return prompt

        def append_user_input(self, prompt):
            return prompt

        def parse_agent_output(self, completion):
            return "", completion

    make_rollout_func(GuessEnv, ChatMLProcessor(), system_prompt="Be brief.")
    with pytest.raises(ConfigError, match="Plain has no `system_prompt` field"):
        make_rollout_func(GuessEnv, Plain(), system_prompt="Be brief.")
    with pytest.raises(ConfigError, match="not callable"):
        make_rollout_func(GuessEnv(), ChatMLProcessor())


def test_conversational_prompts_use_the_last_user_message_as_seed():
    assert glue.prompt_to_seed("7") == "7"
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "9"}]},
    ]
    assert glue.prompt_to_seed(messages) == "9"
    with pytest.raises(ConfigError, match="no message with role .user."):
        glue.prompt_to_seed([{"role": "system", "content": "s"}])


def test_options_come_grouped_or_flat_but_not_both():
    from trl_env.train.options import EngineOptions, Limits

    grouped = make_rollout_func(
        GuessEnv, ChatMLProcessor(), limits=Limits(max_turns=3), engine=EngineOptions(strict=True)
    )
    flat = make_rollout_func(GuessEnv, ChatMLProcessor(), max_turns=3, strict=True)
    assert grouped.options == flat.options and flat.options.limits.max_turns == 3 and flat.options.engine.strict
    with pytest.raises(ConfigError, match="max_turns given both"):
        make_rollout_func(GuessEnv, ChatMLProcessor(), limits=Limits(max_turns=3), max_turns=4)
    with pytest.raises(ConfigError, match="unknown option"):
        make_rollout_func(GuessEnv, ChatMLProcessor(), max_turn=3)
    with pytest.raises(ConfigError, match="env_timeout=0"):
        make_rollout_func(GuessEnv, ChatMLProcessor(), env_timeout=0)


def test_check_template_every_warns_once_when_rollouts_differ_from_the_template(model, tokenizer):
    class Trainer:
        args = grpo_config("unused", max_completion_length=24)
        processing_class = tokenizer
        _metrics = defaultdict(lambda: defaultdict(list))
        accelerator = None

    Trainer.model = Trainer.model_wrapped = model
    seeds = ['{"n": 2, "deltas": ["a", "b"]}'] * 4

    class Extra(ChatMLProcessor):  # writes text the tiny tokenizer's template never writes
        def init_system_input(self, prompt):
            return "Note.\n" + super().init_system_input(prompt)

    from trl_env import TransformersGenerator

    gen = TransformersGenerator(model, pad_token_id=tokenizer.pad_token_id)
    differs = make_rollout_func(ScriptedEnv, Extra(), check_template_every=1, max_new_tokens=4, generator=gen)
    with pytest.warns(UserWarning, match="differs from the chat template"):
        differs(seeds, Trainer())
    from helpers import ScriptedGenerator

    stops_at_once = ScriptedGenerator(
        [5], tokenizer.convert_tokens_to_ids("<|im_end|>"), p_stop=1.0
    )  # replies round-trip
    agrees = make_rollout_func(
        ScriptedEnv, ChatMLProcessor(), check_template_every=1, max_new_tokens=4, generator=stops_at_once
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        agrees(seeds, Trainer())
