"""history="deployed" pays per turn for the new text only: no whole-conversation rendering or tokenisation."""

from __future__ import annotations

import pytest
from history_support import ReplyGenerator, check_rows

from trl_env.render.env_text import EnvText
from trl_env.render.history import DeployedHistory
from trl_env.render.processors import get_processor
from trl_env.rollout import Budgets, batch_rollout
from trl_env.testing.tokenizers import load_tokenizer

TURNS = 24


class HintEnv:
    def __init__(self) -> None:
        self.reward, self.alive, self.turn = 0.0, True, 0

    def reset(self, seed):
        return self, f"Start {seed}: say a number."

    def step(self, action):
        self.turn += 1
        return self, f"\n Turn {self.turn}: {action.strip()} is {'higher' if self.turn % 2 else 'lower'} \n"


def run(tokenizer, processor, monkeypatch, *, reasoning, template_kwargs=None):
    """Rollouts of TURNS turns; and the messages of every chat-template call, the text of every encode."""
    rendered, encoded = [], []
    render, encode = type(tokenizer).apply_chat_template, EnvText.encode

    def counted(self, messages, *args, **kwargs):
        rendered.append(list(messages))
        return render(self, messages, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "apply_chat_template", counted)
    monkeypatch.setattr(EnvText, "encode", lambda self, text: encoded.append(text) or encode(self, text))
    gen = ReplyGenerator(tokenizer, processor, reasoning=reasoning)
    seeds = ["0", "1"]
    budgets = Budgets(max_turns=TURNS, max_new_tokens=256, max_completion_tokens=10**5)
    rollouts = batch_rollout(seeds, HintEnv, processor, tokenizer, gen, budgets=budgets, history="deployed",
                             template_kwargs=template_kwargs, env_workers=1)  # fmt: skip
    monkeypatch.undo()
    assert all(len(r.turns) == TURNS for r in rollouts)
    return rollouts, gen, seeds, rendered, encoded


@pytest.mark.parametrize(("tokenizer_name", "processor_name", "reasoning"),
                         [("pypi:qwen2_5", "qwen2_5", False), ("pypi:qwen3", "qwen3", True)])  # fmt: skip
def test_deployed_renders_and_tokenises_only_each_turns_new_messages(tokenizer_name, processor_name, reasoning,
                                                                       monkeypatch):  # fmt: skip
    tokenizer, processor = load_tokenizer(tokenizer_name), get_processor(processor_name)
    rollouts, gen, seeds, rendered, encoded = run(tokenizer, processor, monkeypatch,
                                                  reasoning=lambda k: reasoning and k % 2 == 0)  # fmt: skip
    # every row token-exact, every request the template's whole rendering, tokenised whole
    check_rows(rollouts, gen, tokenizer, processor, seeds)
    longest = max(len(m) for m in rendered)
    assert longest <= 14, f"a chat-template call rendered {longest} messages; a turn adds 2"
    per_turn = sum(len(text) for text in encoded) / (len(rollouts) * TURNS)
    last = len(tokenizer.decode(gen.requests[-1], skip_special_tokens=False))
    assert per_turn < last / 4, f"{per_turn:.0f} characters tokenised per turn for a {last}-character context"


def test_deployed_turn_by_turn_equals_the_whole_encoding_where_the_template_rewrites_the_prompt():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = get_processor("qwen3_no_thinking")
    history = DeployedHistory.check(processor, tokenizer, EnvText(tokenizer), {"enable_thinking": False})
    conversation = history.extend(None, history.opening("Start: <guess> a number."))
    for k in range(12):
        reply = history.reply(f"{k} or{' ' * (k % 3)}\n{k + 1}<|im_end|>")
        messages = [*conversation.messages, reply, {"role": "user", "content": f" hint {k}\n" if k % 4 else ""}]
        conversation = history.extend(conversation, messages)
        assert conversation.ids == history.encode(messages), k
        assert conversation.ids == list(tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=False))  # fmt: skip


@pytest.mark.parametrize(("tokenizer_name", "processor_name", "template_kwargs"),
                         [("pypi:qwen2_5", "qwen2_5", None), ("pypi:qwen3", "qwen3", None),
                          ("pypi:qwen3", "qwen3_no_thinking", {"enable_thinking": False})])  # fmt: skip
def test_reused_ids_and_the_row_check_equal_the_full_rendering_and_comparison(tokenizer_name, processor_name,
                                                                              template_kwargs):  # fmt: skip
    """The engine compares a turn's prompt with its row only after ``reused`` ids: those must be the previous ones,
    and ``extends`` must answer what comparing the whole context with the full tokenisation answers."""
    tokenizer, processor = load_tokenizer(tokenizer_name), get_processor(processor_name)
    history = DeployedHistory.check(processor, tokenizer, EnvText(tokenizer), template_kwargs)
    conversation = history.extend(None, history.opening("Start 0: say a number."))
    answers = set()
    for k in range(10):
        thought = f"<think>\nMaybe {k}.\n</think>\n\n" if processor_name == "qwen3" and k % 2 else ""
        sampled = list(tokenizer.encode(f"{thought}{k}<|im_end|>", add_special_tokens=False))
        reply = history.reply(tokenizer.decode(sampled, skip_special_tokens=False))
        messages = [*conversation.messages, reply, {"role": "user", "content": f"\n Turn {k}: higher \n"}]
        grown = history.extend(conversation, messages)
        full = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False, **(template_kwargs or {})))  # fmt: skip
        assert grown.ids == full, k
        assert grown.ids[: grown.reused] == conversation.ids[: grown.reused], k
        context = conversation.ids + sampled
        for start in (0, 1, grown.reused, len(conversation.ids) // 2, len(conversation.ids)):  # where the row began
            answer = grown.extends(context[:start], context[start:])
            assert answer == (full[: len(context)] == context), (k, start)
            answers.add(answer)
        conversation = grown
    assert answers == {"qwen2_5": {True}, "qwen3": {True, False}, "qwen3_no_thinking": {False}}[processor_name]


def test_later_batches_reuse_the_probes_and_a_changed_template_is_probed_again(monkeypatch):
    """What the probes showed about a template and a tokenizer is kept for the next batch (each batch_rollout call
    rendered ~30 probe conversations before its first turn); a changed template (or its variables) is probed anew."""
    tokenizer, processor = load_tokenizer("pypi:qwen2_5"), get_processor("qwen2_5")
    monkeypatch.setattr(tokenizer, "chat_template", tokenizer.chat_template + "{#- a template no other test probed #}")
    rendered = []
    render = type(tokenizer).apply_chat_template
    monkeypatch.setattr(type(tokenizer), "apply_chat_template",
                        lambda self, *a, **k: rendered.append(1) or render(self, *a, **k))  # fmt: skip
    budgets = Budgets(max_turns=3, max_new_tokens=64, max_completion_tokens=1000)

    def renders(template_kwargs=None) -> int:
        rendered.clear()
        gen = ReplyGenerator(tokenizer, processor, reasoning=lambda k: False)
        rollouts = batch_rollout(["0"], HintEnv, processor, tokenizer, gen, budgets=budgets, history="deployed",
                                 template_kwargs=template_kwargs, env_workers=1)  # fmt: skip
        count = len(rendered)
        check_rows(rollouts, gen, tokenizer, processor, ["0"], template_kwargs=template_kwargs)
        return count

    first, second = renders(), renders()
    assert second <= 4 < 20 < first, (first, second)  # the episode's own: its opening twice, its turns' layout twice
    assert renders({"tools": None}) == first  # other template variables: probed again
    monkeypatch.setattr(tokenizer, "chat_template", tokenizer.chat_template + "{#- changed #}")
    assert renders() == first
