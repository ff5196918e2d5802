"""Level 3: an unmodified agent program, written with the ``openai`` SDK and a tool, trained through the gateway.

The agent below is ordinary OpenAI-client code: it sends the task with a ``multiply`` tool, runs the calls the model
makes, sends the results back and returns 1.0 when the final answer is right. trl-env runs it once per episode
(``agent_env_factory``): every model call it makes is a turn, rendered with the model's chat template
(``history="deployed"``) and trained token-exactly with ``EpisodeGRPOTrainer``. See docs/agents.md.

The offline models (SmolLM2, the tiny test model) have a ChatML template without tools; their tokenizer gets TRL's
Qwen 2.5 template, which writes the same ChatML tokens and adds the tool layout.

The task is sized for SmolLM2-135M-Instruct: two numbers from 2 to 9, a system prompt with one worked tool call,
and the reward reads the last number of the final reply (``score``). The untrained model never wrote a tool call in
the samples we read (docs/agents.md, "Learning on SmolLM2"), so what it can learn on a CPU is the answer itself.

Hardware: a CPU (2 cores). Run:
    python experiment/examples/agent_tools.py --model tiny --steps 2    # smoke run, about a minute
    python experiment/examples/agent_tools.py                          # SmolLM2-135M-Instruct, offline
    python benchmarks/agent_tools_smollm2.py                           # SmolLM2 reward before and after training
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/

from trl_env import AgentRun, agent_env_factory  # noqa: E402

MAX_CALLS = 3
SYSTEM_PROMPT = (
    'You are a calculator. To multiply, call the multiply tool, e.g. for "3 * 4?" reply <tool_call>\n'
    '{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call> and after the tool answers 12, reply 12. '
    "Reply with the number only."
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


def task(seed: str) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randint(2, 9), rng.randint(2, 9)


def score(reply: str, a: int, b: int) -> float:
    """1.0 when the last number in the final reply is ``a * b`` ("42", "6 * 7 = 42."), else 0.0."""
    numbers = re.findall(r"\d+", reply)
    return float(bool(numbers) and numbers[-1] == str(a * b))


def agent(run: AgentRun) -> float:
    """The agent program: plain openai-SDK code with a tool loop."""
    from transformers.utils import get_json_schema

    a, b = task(run.seed)
    client = run.openai(max_retries=0)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"What is {a} * {b}?"},
    ]
    tools = [get_json_schema(multiply)]
    for _ in range(MAX_CALLS):
        reply = client.chat.completions.create(model=run.model, messages=messages, tools=tools).choices[0]
        messages.append(reply.message.model_dump(exclude_none=True))
        if not reply.message.tool_calls:
            return score(reply.message.content or "", a, b)
        for call in reply.message.tool_calls:
            try:
                result = str(multiply(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as e:
                result = f"Error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if reply.finish_reason == "length":
            return 0.0
    return 0.0


def env(**kwargs: Any) -> Any:
    """The agent as an env, for ``trl-env eval --env experiment/examples/agent_tools.py:env --history deployed``."""
    return agent_env_factory(agent, **kwargs)()


def main(argv: list[str] | None = None) -> dict[str, float]:
    return train_agent(
        agent, __doc__, name="agent_tools", max_turns=MAX_CALLS + 1, max_completion_length=256, argv=argv
    )


def train_agent(
    program: Any,
    doc: str,
    *,
    name: str,
    max_turns: int,
    max_completion_length: int,
    argv: list[str] | None = None,
    seeds: list[str] | None = None,
    **rollout_options: Any,
) -> dict[str, float]:
    """Train ``program`` (an agent on the gateway) with EpisodeGRPOTrainer and report, as the other examples do.

    ``seeds``: the dataset's prompts (default ``mul-0`` .. ``mul-999``); ``rollout_options`` go to
    ``make_rollout_func``.
    """
    import torch
    from datasets import Dataset
    from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig

    from trl_env import EpisodeGRPOTrainer, env_reward, from_tokenizer, make_rollout_func
    from trl_env.testing.templates import trl_templates

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' (offline default), 'tiny', or a path/hub id")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=f"outputs/{name}")
    parser.add_argument("--lr", type=float, default=None, help="default: 1e-3 for tiny, 3e-5 otherwise")
    parser.add_argument("--batch", type=int, default=8, help="episodes per step (per_device_train_batch_size)")
    parser.add_argument("--generations", type=int, default=4, help="episodes per prompt (a GRPO group)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every call")
    parser.add_argument("--budget-s", type=float, default=None, help="stop after the step that passes this wall")
    parser.add_argument("--save", default=None, help="save the trained model and tokenizer here (for trl-env eval)")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
    tokenizer.chat_template = trl_templates()["qwen2_5"]  # ChatML with the tool layout
    os.makedirs(args.out, exist_ok=True)
    func = make_rollout_func(
        agent_env_factory(program),
        from_tokenizer(tokenizer),
        history="deployed",
        max_turns=max_turns,
        max_new_tokens=16 if args.model == "tiny" else 40,
        # the random tiny model almost never ends a reply within 16 tokens: its cut calls are answered (finish_reason
        # "length") so the smoke run trains instead of stopping at a step whose every first call was cut
        **{"env_timeout": 120, "parse_truncated_turns": args.model == "tiny", **rollout_options},
    )
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch,
        num_generations=args.generations, max_completion_length=max_completion_length,
        learning_rate=args.lr if args.lr is not None else 1e-3 if args.model == "tiny" else 3e-5,
        temperature=args.temperature, beta=0.0,
        logging_steps=1, report_to=[], save_strategy="no", seed=args.seed, data_seed=args.seed, use_cpu=True,
        bf16=False, gradient_checkpointing=False,  # float32: TRL's bf16 default is slow on CPUs
    )  # fmt: skip
    started = time.perf_counter()

    class Budget(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                control.should_training_stop = True

    trainer = EpisodeGRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": seeds if seeds is not None else [f"mul-{i}" for i in range(1000)]}),
        processing_class=tokenizer,
        rollout_func=func,
        callbacks=[Budget()],
    )
    trainer.train()
    wall = time.perf_counter() - started
    rewards = [h["reward"] for h in trainer.state.log_history if h.get("reward") is not None]
    k = max(1, len(rewards) // 4)
    summary = {"first_mean": sum(rewards[:k]) / k, "last_mean": sum(rewards[-k:]) / k, "wall_s": wall}
    print(f"[{name}] reward per step: {[round(r, 3) for r in rewards]}; {summary}")
    with open(os.path.join(args.out, f"rewards_seed{args.seed}.json"), "w") as f:
        json.dump({"rewards": rewards, **summary}, f)
    if args.save:
        trainer.save_model(args.save)  # model and tokenizer, with the tool template set above
    return summary


if __name__ == "__main__":
    main()
