"""What reads a Rollout reads every row: metrics, transcripts and reward functions' log_extra, for episodes of several
rows (history="deployed") as for one."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

from history_support import NumberedTalkEnv, ReplyGenerator, thinking_tokenizer, thinks_by_episode

from trl_env import make_rollout_func
from trl_env.backends.base import FinishReason
from trl_env.render.processors import from_tokenizer
from trl_env.rollout import Ending, Rollout, Row, Span, Turn
from trl_env.rollout.transcripts import write_transcripts
from trl_env.train.metrics import log_metrics


def turn(text: str) -> Turn:
    return Turn(text, "", text, "ok", 1.0, FinishReason.STOP, 2, 1, 0.0, 0.0)


def two_row_rollout() -> Rollout:
    """A deployed episode: the second turn's context rewrote the first, so two rows."""
    first = Row.of_turns([1, 2], [10, 11, 3], [-0.1, -0.2, 0.0], [1, 1, 0], [turn("a")])
    last = Row([1, 2, 4], [12, 13, 14], [-0.3, -0.4, -0.5], [1, 1, 1], (Span(1, slice(0, 2), slice(2, 3)),))
    return Rollout("s", (first, last), (turn("a"), turn("b")), 1.0, Ending.ENV_DONE)


def test_model_token_metric_counts_every_row_of_a_deployed_episode():
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)}, model=SimpleNamespace(training=True))
    one_row = Rollout.single("t", [1], [5, 6], [-0.1, -0.1], [1, 1], (turn("c"),), 0.0, Ending.ENV_DONE)
    log_metrics(trainer, [two_row_rollout(), one_row])
    assert trainer._metrics["train"]["env/model_tokens_mean"] == [(2 + 3 + 2) / 2]  # the last row alone gave 2.5


def test_transcripts_write_every_row_of_a_deployed_episode(tmp_path, tokenizer):
    path = tmp_path / "t.jsonl"
    r = two_row_rollout()
    write_transcripts(path, [r], tokenizer=tokenizer)
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["rows"] == [tokenizer.decode(w.prompt_ids + w.completion_ids) for w in r.rows]
    assert line["conversation"] == line["rows"][-1]


def test_log_extra_values_of_reward_functions_land_beside_their_episodes_rows(tmp_path, model, tokenizer):
    """A reward function logs one value per episode; EpisodeGRPOTrainer's completions table has one line per row:
    each row's value is its episode's (they were misaligned: episode values beside row completions)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from trl_env.train.episode_trainer import EpisodeGRPOTrainer

    def turns_logged(completions, env_turns, log_extra=None, **kwargs):
        log_extra("turns", [float(t) for t in env_turns])
        return [0.1 * t for t in env_turns]

    tok = thinking_tokenizer(tokenizer)
    processor = from_tokenizer(tok)
    gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
    func = make_rollout_func(NumberedTalkEnv, processor, history="deployed", generator=gen, max_turns=3, env_workers=1)
    seen = []
    rollouts = func.rollouts
    func.rollouts = lambda prompts, trainer: seen.append(rollouts(prompts, trainer)) or seen[-1]
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=128, max_steps=1, logging_steps=1, report_to=[], save_strategy="no",
                      use_cpu=True, bf16=False, seed=0)  # fmt: skip
    trainer = EpisodeGRPOTrainer(model=model, reward_funcs=[turns_logged], args=args, processing_class=tok,
                                 train_dataset=Dataset.from_dict({"prompt": ["1", "2"] * 8}),
                                 rollout_func=func)  # fmt: skip
    trainer.train()
    (episodes,) = seen
    expected = [float(len(r.turns)) for r in episodes for _ in r.rows]
    assert len(expected) > len(episodes), "some episode has several rows"
    logged = list(trainer._logs["extra"]["turns"])
    assert len(logged) == len(trainer._logs["prompt"])  # one value per logged completion (row)
    assert logged == expected[-len(logged) :]  # TRL's logs keep the last generation_batch_size completions


def test_to_trl_refuses_an_episode_of_several_rows_and_to_trl_rows_gives_each():
    """to_trl gave a deployed episode's last row silently; one rule (to_trl_rows) now serves both."""
    import pytest

    from trl_env import ConfigError, to_trl
    from trl_env.train.trl_output import to_trl_rows

    r, one = two_row_rollout(), Rollout.single("t", [1], [5, 6], [-0.1, -0.1], [1, 1], (turn("c"),), 0.0,
                                               Ending.ENV_DONE)  # fmt: skip
    with pytest.raises(ConfigError, match=r"episode 0 has 2 training rows .*use to_trl_rows"):
        to_trl([r, one])
    rows, episode_of_row = to_trl_rows([r, one])
    assert episode_of_row == [0, 0, 1] and rows["completion_ids"] == [[10, 11, 3], [12, 13, 14], [5, 6]]
    assert to_trl([one])["completion_ids"] == [one.completion_ids]


def test_spans_walk_each_rows_turns_once_and_refuse_an_inconsistent_record():
    """Rollout.spans: the one walk from turns to token spans (token_advantages and the async samples read it)."""
    import pytest

    from trl_env import ConfigError
    from trl_env.train.credit import token_advantages

    r = two_row_rollout()  # each turn: 2 model tokens; the first row's turn is answered by 1 env token
    (first, first_spans), (last, last_spans) = r.spans()
    assert first is r.rows[0] and last is r.rows[1]
    assert [(s.turn, s.model, s.env) for s in first_spans] == [(0, slice(0, 2), slice(2, 3))]
    assert [(s.turn, s.model, s.env) for s in last_spans] == [(1, slice(0, 2), slice(2, 3))]
    assert token_advantages(r, [0.5, -1.0]) == [[0.5, 0.5, 0.0], [-1.0, -1.0, 0.0]]
    bad = Rollout.single("s", [1], [5, 6], [-0.1, -0.1], [1, 1], (turn("a"), turn("b")), 1.0, Ending.ENV_DONE)
    with pytest.raises(ConfigError, match="2 turns hold 6 tokens but its completion has 2"):
        bad.spans()


def test_each_row_stores_its_turns_spans_where_the_engine_laid_them(tokenizer):
    """Row.spans is recorded when the engine builds the row (Rollout.spans reads it): each turn's sampled ids, then
    its env tokens, in every row of every mode."""
    from trl_env.rollout import Budgets, batch_rollout

    tok = thinking_tokenizer(tokenizer)
    processor = from_tokenizer(tok)
    budgets = Budgets(max_turns=3, max_new_tokens=64, max_completion_tokens=512)
    for history in ("sampled", "deployed"):
        gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
        rollouts = batch_rollout(["1", "2", "3", "4"], NumberedTalkEnv, processor, tok, gen, budgets=budgets,
                                 history=history, env_workers=1)  # fmt: skip
        assert max(len(r.rows) for r in rollouts) == (1 if history == "sampled" else 3)
        for r in rollouts:
            assert [s.turn for row in r.rows for s in row.spans] == list(range(len(r.turns)))
            assert [spans for _, spans in r.spans()] == [list(row.spans) for row in r.rows]
            for row in r.rows:
                for s in row.spans:
                    sampled = row.completion_ids[s.model]
                    text = r.turns[s.turn].text  # "" for a turn the env never stepped on (FlakyTalkEnv fails some)
                    assert tok.decode(sampled, skip_special_tokens=False) == text or not text
                    assert row.env_mask[s.model] == [1] * len(sampled) and row.env_mask[s.env] == [0] * (
                        s.env.stop - s.env.start)  # fmt: skip
                assert row.spans[-1].env.stop == len(row.completion_ids)


def test_a_rollouts_own_lists_mean_its_one_row_in_every_mode_and_a_deployed_episode_of_several_rows_has_none(
    tokenizer,
):
    """Rollout.prompt_ids/completion_ids/logprobs/env_mask were the last row under history="deployed" (the episode's
    one row under "sampled"): now the one row's in both modes, and a clear error naming rollout.rows for several."""
    import pytest

    from trl_env import ConfigError
    from trl_env.rollout import Budgets, batch_rollout

    tok = thinking_tokenizer(tokenizer)
    processor = from_tokenizer(tok)
    budgets = Budgets(max_turns=3, max_new_tokens=64, max_completion_tokens=512)
    seen = set()
    for history in ("sampled", "deployed"):
        gen = ReplyGenerator(tok, processor, think=thinks_by_episode)
        for r in batch_rollout(["1", "2", "3", "4"], NumberedTalkEnv, processor, tok, gen, budgets=budgets,
                               history=history, env_workers=1):  # fmt: skip
            seen.add((history, len(r.rows) > 1))
            if len(r.rows) == 1:
                (row,) = r.rows
                assert (r.prompt_ids, r.completion_ids, r.logprobs, r.env_mask) == (
                    row.prompt_ids, row.completion_ids, row.logprobs, row.env_mask)  # fmt: skip
                continue
            for name in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
                with pytest.raises(ConfigError, match=rf"has {len(r.rows)} training rows .*read rollout\.rows"):
                    getattr(r, name)
    assert seen == {("sampled", False), ("deployed", False), ("deployed", True)}
