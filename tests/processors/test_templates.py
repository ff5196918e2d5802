"""Parity over every text-model chat template the installed TRL ships (``trl/chat_templates/*.jinja``).

The cases come from listing the folder, so a new TRL adds cases by itself. Each template goes through
``from_tokenizer`` on a stand-in tokenizer (Qwen's BPE with the family's special tokens, BOS and EOS),
and the processor it returns must render exactly as the template does at the generation boundary:
the opening equals the template's rendering of ``[system?, user]`` with the generation prompt, and each
later rendering ends with reply + end-of-turn + ``append_user_input(next user)``, for 1-4 user turns,
with and without a system prompt, with plain user text and with whitespace, newlines and non-ASCII.
"""

from __future__ import annotations

import pytest
from helpers import sweep

from trl_env.render.processors import from_tokenizer, get_processor
from trl_env.render.processors.derived import history_stop
from trl_env.testing.templates import DERIVED_ONLY, NAMED_TEMPLATES, VISION_ONLY, trl_template_tokenizer, trl_templates

TEMPLATES = sorted(trl_templates())
PLAIN = ["First user", "Second user", "Third user", "Fourth user"]
PADDED = [" \nFirst üser, naïve\n ", "  Second 用户 ", "\tThird user\n\n", "Fourth user. "]
REPLIES = ["Reply one", "Reply two.", "Reply 3"]
SYSTEM = "  Be brief;\nanswer in French. "
REFUSED: dict[str, str] = {}
"""Template -> why it is refused (none today)."""


def _render(tokenizer, messages, kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def _has_system_role(tokenizer, kwargs):
    try:
        _render(tokenizer, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], kwargs)
    except Exception:  # noqa: BLE001  # e.g. Gemma's "System role not supported"
        return False
    return True


def _variants(name):
    text = trl_templates()[name]
    return [{}, {"enable_thinking": False}] if "enable_thinking" in text else [{}]


CASES = [(name, kwargs) for name in TEMPLATES for kwargs in _variants(name)]


def assert_serves(processor, tokenizer, kwargs, system):
    """``processor`` (built with ``system``) renders as the template at the generation boundary."""
    stop = history_stop(processor)  # what the template writes after a past reply
    # the model samples it (its last token being the stop token), or the processor declares the rewrite
    assert stop.endswith(processor.stop_strings[0]) or getattr(processor, "rendered_stop", None) is not None, stop
    for users in (PLAIN, PADDED):
        messages = [] if system is None else [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": users[0]})
        assert processor.init_system_input(users[0]) == _render(tokenizer, messages, kwargs), (system, users)
        for k in range(1, 4):
            messages += [{"role": "assistant", "content": REPLIES[k - 1]}, {"role": "user", "content": users[k]}]
            expected = REPLIES[k - 1] + stop + processor.append_user_input(users[k])
            rendered = _render(tokenizer, messages, kwargs)
            assert rendered.endswith(expected), (system, users, k, rendered[-300:], expected)


@pytest.mark.parametrize(("name", "kwargs"), sweep(CASES, lambda c: c[0], ids=[f"{n}{k or ''}" for n, k in CASES]))
def test_every_trl_template_is_served_exactly_at_the_generation_boundary(name, kwargs):
    tokenizer = trl_template_tokenizer(name)
    if name in REFUSED:
        pytest.skip(REFUSED[name])
    for system in [None, SYSTEM] if _has_system_role(tokenizer, kwargs) else [None]:
        assert_serves(
            from_tokenizer(tokenizer, system_prompt=system, template_kwargs=kwargs), tokenizer, kwargs, system
        )


NAMED_CASES = [(name, t, kw) for name, served in NAMED_TEMPLATES.items() for t, kw in served]


@pytest.mark.parametrize(
    ("name", "template", "kwargs"),
    sweep(NAMED_CASES, lambda c: c[1], ids=[f"{n}-{t}{k or ''}" for n, t, k in NAMED_CASES]),
)
def test_each_registry_name_renders_as_its_official_templates(name, template, kwargs):
    tokenizer = trl_template_tokenizer(template)
    for system in [None, SYSTEM] if _has_system_role(tokenizer, kwargs) else [None]:
        assert_serves(get_processor(name, system_prompt=system), tokenizer, kwargs, system)


def test_every_official_template_has_a_registry_name_or_says_why_not():
    named = {t.removesuffix("_training") for served in NAMED_TEMPLATES.values() for t, _ in served}
    originals = {t for t in TEMPLATES if not t.endswith("_training")}
    assert originals - named == set(DERIVED_ONLY)


def test_the_list_covers_the_folder_minus_vision_only_templates():
    every = trl_templates(text_only=False)
    assert set(TEMPLATES) == {n for n in every if n.removesuffix("_training") not in VISION_ONLY}
    assert len(TEMPLATES) >= 60  # TRL 1.16 ships 72 .jinja files, 66 of them text templates


REAL = [("pypi:qwen3", t) for t in ("qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8", "qwen3_instruct_2507")]
REAL += [("pypi:qwen3", "qwen3_vl"), ("pypi:qwen3", "qwen2_5_vl"), ("pypi:deepseek_r1", "deepseekv3")]


@pytest.mark.parametrize(("tokenizer_name", "template"), REAL, ids=[f"{n}-{t}" for n, t in REAL])
def test_token_level_through_real_tokenizers(offline_tokenizer, tokenizer_name, template):
    """The engine's ids equal the ids of its history text, and each rendering's ids end with the appended turn's."""
    from families_support import USERS, encode, messages_for, run_engine

    tokenizer = offline_tokenizer(tokenizer_name)
    saved, tokenizer.chat_template = tokenizer.chat_template, trl_templates()[template]
    try:
        processor = from_tokenizer(tokenizer)
        stop = history_stop(processor)
        answers = [*REPLIES, "Reply four"]
        replies = [processor.render_agent_output("so: 日本", a) for a in answers]  # reasoning, as the model samples
        ids, actions = run_engine(tokenizer, processor, USERS, replies)
        history = processor.init_system_input(USERS[0])
        history += "".join(r + stop + processor.append_user_input(u) for r, u in zip(replies, USERS[1:], strict=False))
        assert ids == encode(tokenizer, history)
        assert actions == answers[: len(actions)]
        for k in range(1, len(USERS) + 1):
            rendered = encode(tokenizer, _render(tokenizer, messages_for(None, USERS[:k], replies), {}))
            newest = processor.init_system_input(USERS[0]) if k == 1 else processor.append_user_input(USERS[k - 1])
            assert rendered[-len(encode(tokenizer, newest)) :] == encode(tokenizer, newest), k
    finally:
        tokenizer.chat_template = saved
