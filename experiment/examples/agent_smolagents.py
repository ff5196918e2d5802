"""An unmodified smolagents agent (``ToolCallingAgent`` on ``OpenAIServerModel``, a ``multiply`` tool), trained through
the gateway.

smolagents is Hugging Face's agent framework, written against any OpenAI-compatible server through its
``OpenAIServerModel``: the agent below is ordinary smolagents code, given the episode's ``base_url`` and key. trl-env
runs it once per episode (``agent_env_factory``); every model call smolagents makes (each tool-calling step, and its
final-answer call when the steps run out) is a turn, rendered with the model's chat template (``history="deployed"``)
and trained token-exactly. The task is agent_tools.py's (multiply two numbers with the tool); smolagents' own 3.8k-
character system prompt is replaced by a short one so that a turn fits the small models' context.

Hardware: a CPU (2 cores). Run:
    python experiment/examples/agent_smolagents.py --model tiny --steps 2    # smoke run
    python experiment/examples/agent_smolagents.py                          # SmolLM2-135M-Instruct, offline
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # experiment/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiment/examples/

from agent_tools import task  # noqa: E402  # the same seeded task: two numbers to multiply

from trl_env.agents import AgentRun, agent_env_factory  # noqa: E402

MAX_STEPS = 2  # tool-calling steps; smolagents then asks once more for a final answer
SYSTEM_PROMPT = (
    "You solve tasks with tools. Call the multiply tool, then call final_answer with the number.\n"
    "Tools:\n{%- for tool in tools.values() %}\n- {{ tool.name }}: {{ tool.description }}{%- endfor %}"
)


def prompt_templates() -> dict:
    """smolagents' own ToolCallingAgent templates, with the short system prompt above."""
    import importlib.resources

    import yaml

    text = importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text()
    templates = yaml.safe_load(text)
    templates["system_prompt"] = SYSTEM_PROMPT
    return templates


def agent(run: AgentRun) -> float:
    """The agent program: plain smolagents code against the episode's OpenAI-compatible endpoint."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first number
            b: the second number
        """
        return a * b

    a, b = task(run.seed)
    model = OpenAIServerModel(
        model_id=run.model, api_base=run.base_url, api_key=run.api_key, client_kwargs={"max_retries": 0}
    )
    solver = ToolCallingAgent(
        tools=[multiply], model=model, max_steps=MAX_STEPS, verbosity_level=0, prompt_templates=prompt_templates()
    )
    answer = solver.run(f"What is {a} * {b}?")
    return float(str(answer).strip() == str(a * b))


def main(argv: list[str] | None = None) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from models import load_model_and_tokenizer  # experiment/models.py: offline SmolLM2, tiny model, any path
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from trl_env import env_reward, make_rollout_func
    from trl_env.integrations.episode_trainer import EpisodeGRPOTrainer
    from trl_env.processors import from_tokenizer
    from trl_env.testing.templates import trl_templates

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2' (offline default), 'tiny', or a path/hub id")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/agent_smolagents")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, tokenizer = load_model_and_tokenizer(args.model, AutoModelForCausalLM, AutoTokenizer)
    tokenizer.chat_template = trl_templates()["qwen2_5"]  # ChatML with the tool layout
    os.makedirs(args.out, exist_ok=True)
    func = make_rollout_func(
        agent_env_factory(agent),
        from_tokenizer(tokenizer),
        history="deployed",
        max_turns=MAX_STEPS + 1,
        max_new_tokens=16 if args.model == "tiny" else 48,
        env_timeout=120,
    )
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=512, learning_rate=1e-3 if args.model == "tiny" else 3e-5, temperature=1.0, beta=0.0,
        logging_steps=1, report_to=[], save_strategy="no", seed=args.seed, data_seed=args.seed, use_cpu=True,
    )  # fmt: skip
    trainer = EpisodeGRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [f"mul-{i}" for i in range(1000)]}),
        processing_class=tokenizer,
        rollout_func=func,
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    rewards = [h["reward"] for h in trainer.state.log_history if h.get("reward") is not None]
    k = max(1, len(rewards) // 4)
    summary = {"first_mean": sum(rewards[:k]) / k, "last_mean": sum(rewards[-k:]) / k, "wall_s": wall}
    print(f"[agent_smolagents] reward per step: {[round(r, 3) for r in rewards]}; {summary}")
    with open(os.path.join(args.out, f"rewards_seed{args.seed}.json"), "w") as f:
        json.dump({"rewards": rewards, **summary}, f)
    return summary


if __name__ == "__main__":
    main()
