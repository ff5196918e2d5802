"""ChatML processor: agrees with the chat template turn by turn, prefix property, parsing edge cases."""

import pytest

from trl_env import ChatMLProcessor, ConfigError, Env, Processor, get_processor, split_reasoning
from trl_env.render.processors.base import stop_token_ids


def render_like_engine(processor, user_turns, assistant_turns):
    """Text the engine's token history decodes to: opening, then (model turn + appended user input) per turn."""
    text = processor.init_system_input(user_turns[0])
    for reply, user in zip(assistant_turns, user_turns[1:], strict=False):
        text += reply + "<|im_end|>" + processor.append_user_input(user)
    return text


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_chatml_processor_matches_the_chat_template_turn_by_turn(tokenizer, system):
    users = ["Guess a number.", " leading space", "line\nbreak\n", "日本 → é", "42"]
    replies = ["50", "<think>hmm</think>25", " 12 ", "x"]
    processor = ChatMLProcessor(system_prompt=system)
    for k in range(1, len(users) + 1):
        messages = [{"role": "system", "content": system}] if system is not None else []
        for i in range(k):
            messages.append({"role": "user", "content": users[i]})
            if i < k - 1:
                messages.append({"role": "assistant", "content": replies[i]})
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        mine = render_like_engine(processor, users[:k], replies[: k - 1])
        assert mine == expected
        ids = tokenizer.encode(mine, add_special_tokens=False)
        assert ids == tokenizer.encode(expected, add_special_tokens=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42<|im_end|>", ("", "42")),
        ("<think>half way</think> 42 <|im_end|>", ("half way", "42")),
        ("<think>cut mid-thought, no close", ("cut mid-thought, no close", "")),
        ("no tags at all", ("", "no tags at all")),
        ("reasoning</think>answer", ("reasoning", "answer")),
        ("", ("", "")),
    ],
)
def test_parse_agent_output_never_takes_half_a_thought_as_the_action(text, expected):
    assert ChatMLProcessor().parse_agent_output(text) == expected
    assert split_reasoning(text, strip=("<|im_end|>",)) == expected


def test_stop_ids_are_the_end_of_turn_token_and_eos_and_must_be_single_tokens(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(ChatMLProcessor(), tokenizer)[0] == im_end
    with pytest.raises(ConfigError, match="must be one"):
        stop_token_ids(ChatMLProcessor(stop_strings=("two words",)), tokenizer)


def test_registry_builds_processors_and_lists_known_names():
    assert isinstance(get_processor("chatml"), Processor)
    assert get_processor("qwen2_5", system_prompt="s").system_prompt == "s"
    with pytest.raises(ConfigError, match="known processors: chatml, qwen2_5, smollm2"):
        get_processor("gpt2")


def test_envs_work_by_explicit_subclassing_and_by_shape():
    class Countdown(Env):
        def __init__(self) -> None:
            self.reward, self.alive, self.left = 0.0, True, 0

        def reset(self, seed):
            self.left = int(seed)
            return self, "go"

        def step(self, action):
            self.left -= 1
            self.alive = self.left > 0
            return self, "ok"

    class Shaped:
        reward, alive = 0.0, True

        def reset(self, seed):
            return self, ""

        def step(self, action):
            return self, ""

    env = Countdown()
    assert env.reset("2")[0] is env and env.left == 2
    assert isinstance(env, Env) and isinstance(Shaped(), Env)


def test_split_reasoning_and_parse_output_agree_on_the_last_closing_tag():
    from trl_env.render.processors.base import parse_output

    text = "<think>plan</think> draft </think> 42"
    parsed = parse_output(text)
    assert split_reasoning(text) == (parsed.reasoning, parsed.action) == ("plan</think> draft", "42")
