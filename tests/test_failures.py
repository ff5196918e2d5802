"""Issue 47 item 1: failures a user cannot miss. Failed episodes are said in words in the training log (each kind's
first message, then at doubling counts); a step whose every episode failed for one configuration reason stops
training with that message unless ``stop_on_config_failure=False``; ``trl-env eval`` prints the same."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset
from trl import GRPOConfig

from trl_env import (
    Action,
    ChatMLProcessor,
    Delta,
    Env,
    EpisodeGRPOTrainer,
    Seed,
    agent_env_factory,
    env_reward,
    from_tokenizer,
    make_rollout_func,
)
from trl_env.backends.base import FinishReason
from trl_env.rollout import Ending, Rollout, Turn
from trl_env.rollout.failures import ConfigFailureError, FailureLog, config_failure, cut_at_first_turn


def rollout(ending=Ending.ENV_DONE, *, kind=None, error="", turns=(), info=None):
    info = dict(info or {})
    if kind:
        info["error_kind"] = kind
    return Rollout.single("s", [1, 2], [3], [0.0], [1], tuple(turns), None, ending, error, info)


def cut_turn(action=None):
    return Turn("abcd", "", action, None, None, FinishReason.LENGTH, 4, 0, 0.0, 0.0)


PROCESSOR_FAILED = "ProcessorError: this chat template does not render a tool-calling conversation\nTraceback x\n y"


def test_config_failure_names_a_step_whose_every_episode_failed_alike_and_quotes_the_message():
    failed = [rollout(Ending.ERROR, kind="processor_error", error=PROCESSOR_FAILED) for _ in range(4)]
    reason = config_failure(failed)
    assert "every episode of this step (4) failed with processor_error" in reason
    assert "does not render a tool-calling conversation" in reason and "Traceback" not in reason
    assert config_failure([*failed[:3], rollout()]) is None  # one episode went through
    assert config_failure([rollout(Ending.ERROR, kind="env_exception", error="boom")] * 4) is None  # env code: no
    too_long = [rollout(Ending.LENGTH, info={"prompt_too_long": n}) for n in (40, 52)]
    assert "opening prompt (40 to 52 tokens) leaves no room" in config_failure(too_long)


def test_a_step_cut_at_every_first_turn_is_named_but_not_a_config_failure():
    cut = [rollout(Ending.LENGTH, turns=[cut_turn()]) for _ in range(4)]
    assert "cut by the token budget at its first model turn (4 tokens)" in cut_at_first_turn(cut)
    assert "parse_truncated_turns=True" in cut_at_first_turn(cut)
    assert config_failure(cut) is None
    assert cut_at_first_turn([*cut[:3], rollout(Ending.LENGTH, turns=[cut_turn("parsed")])]) is None


def test_the_failure_log_says_each_kind_once_then_at_doubling_counts():
    said = []
    log = FailureLog(say=said.append)
    step = [rollout(Ending.ERROR, kind="env_exception", error="ValueError: bad move\nTraceback..."), rollout()]
    for i in range(1, 9):
        log(step, step=i)
    assert len(said) == 4  # counts 1 (the message), 2, 4, 8: not once per episode or per step
    assert said[0].startswith("trl-env: 1 of 2 episodes failed at step 1 with env_exception")
    assert "ValueError: bad move" in said[0] and "strict=True" in said[0]
    assert [s.split(" episodes")[0] for s in said[1:]] == ["trl-env: 2", "trl-env: 4", "trl-env: 8"]


def test_the_failure_log_stops_on_a_config_failure_unless_told_to_go_on():
    failed = [rollout(Ending.ERROR, kind="processor_error", error=PROCESSOR_FAILED)] * 2
    with pytest.raises(ConfigFailureError, match="stopped training at step 3: every episode.*stop_on_config_failure"):
        FailureLog(say=lambda _: None)(failed, step=3)
    said = []
    FailureLog(stop_on_config_failure=False, say=said.append)(failed, step=3)
    assert any("every episode of this step (2) failed with processor_error" in s for s in said)


# Real runs: the tiny model, a real EpisodeGRPOTrainer, an agent program through the gateway.


def tool_agent(run):
    """An agent program that offers the model a tool, as the issue's user did."""
    client = run.openai(max_retries=0)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
            },
        }
    ]
    client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": "1+2?"}], tools=tools)
    return 1.0


def agent_trainer(model, tokenizer, tmp_path, program=None, *, max_new_tokens=8, steps=2, **options):
    func = make_rollout_func(
        agent_env_factory(program or tool_agent),
        from_tokenizer(tokenizer),
        history="deployed",
        max_turns=2,
        max_new_tokens=max_new_tokens,
        **options,
    )
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    return EpisodeGRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tokenizer,
        rollout_func=func,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"] * 4}),
    )


def test_an_agent_with_tools_on_a_template_without_tools_stops_training_with_the_template_error(
    model, tokenizer, tmp_path
):
    trainer = agent_trainer(model, tokenizer, tmp_path)
    with pytest.raises(ConfigFailureError) as stopped:
        trainer.train()
    message = str(stopped.value)
    assert "stopped training at step 1" in message and "processor_error" in message
    assert "does not render a tool-calling conversation" in message and "stop_on_config_failure=False" in message
    assert trainer.state.global_step == 0  # nothing was trained on


def test_told_to_go_on_it_trains_and_the_log_says_the_error_in_words(model, tokenizer, tmp_path, caplog):
    trainer = agent_trainer(model, tokenizer, tmp_path, stop_on_config_failure=False)
    with caplog.at_level(logging.WARNING, logger="trl_env"):
        trainer.train()
    assert trainer.state.global_step == 2
    said = [r.getMessage() for r in caplog.records if r.name == "trl_env"]
    firsts = [s for s in said if "episodes failed at step 1 with processor_error" in s]
    assert len(firsts) == 1 and "does not render a tool-calling conversation" in firsts[0], said
    assert sum("every episode of this step (4) failed with processor_error" in s for s in said) >= 1


class Say(Env):
    """One turn: any answer ends the game."""

    def __init__(self) -> None:
        self.reward, self.alive = 0.0, True

    def reset(self, seed: Seed) -> tuple[Env, Delta]:
        return self, "Say something."

    def step(self, action: Action) -> tuple[Env, Delta]:
        self.reward, self.alive = 1.0, False
        return self, "Thanks."


def test_a_run_whose_every_first_turn_is_cut_says_so_in_the_log(model, tokenizer, tmp_path, caplog):
    import trl

    func = make_rollout_func(Say, ChatMLProcessor(), max_turns=2, max_new_tokens=1)  # one token: cut, never parsed
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tokenizer,
        rollout_func=func,
        train_dataset=Dataset.from_dict({"prompt": ["a"] * 4}),
    )
    with caplog.at_level(logging.WARNING, logger="trl_env"):
        trainer.train()
    said = " ".join(r.getMessage() for r in caplog.records if r.name == "trl_env")
    assert "cut by the token budget at its first model turn (1 tokens)" in said
    assert "parse_truncated_turns=True" in said


def test_eval_prints_the_same(tmp_path, capsys):
    from trl_env.tools.cli import main

    status = main(
        [
            "eval",
            "--env",
            "experiment/examples/guess_number.py:GuessNumberEnv",
            "--model",
            "tiny",
            "--n",
            "4",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "1",
        ]
    )
    assert status == 0
    err = capsys.readouterr().err
    assert "every episode of this step (4) was cut by the token budget at its first model turn" in err


def test_agent_episodes_all_cut_at_their_first_call_are_a_config_failure():
    agent_info = {"env": {"agent_calls": 1}}
    cut = [rollout(Ending.LENGTH, turns=[cut_turn()], info=agent_info) for _ in range(4)]
    reason = config_failure(cut)
    assert "every agent episode of this step (4) ended at its first model call" in reason
    assert "parse_truncated_turns=True" in reason
    assert config_failure([*cut[:3], rollout(Ending.LENGTH, turns=[cut_turn()])]) is None  # one is no agent
    assert config_failure([*cut[:3], rollout(Ending.ENV_DONE, turns=[cut_turn("ok")], info=agent_info)]) is None


def plain_agent(run):
    """An agent program without tools: one call, its reply read."""
    client = run.openai(max_retries=0)
    reply = client.chat.completions.create(model=run.model, messages=[{"role": "user", "content": "Say hi."}])
    return float(bool(reply.choices[0].message.content))


def test_an_agent_run_whose_every_call_is_cut_stops_unless_cut_calls_are_answered(model, tokenizer, tmp_path):
    trainer = agent_trainer(model, tokenizer, tmp_path / "cut", plain_agent, max_new_tokens=2, steps=1)  # always cut
    with pytest.raises(ConfigFailureError, match="ended at its first model call") as stopped:
        trainer.train()
    assert "parse_truncated_turns=True" in str(stopped.value) and trainer.state.global_step == 0
    answered = agent_trainer(
        model, tokenizer, tmp_path / "answered", plain_agent, max_new_tokens=2, steps=1, parse_truncated_turns=True
    )
    answered.train()  # a cut call is answered with finish_reason="length": the program goes on
    assert answered.state.global_step == 1
