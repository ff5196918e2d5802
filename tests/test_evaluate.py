"""`trl-env eval`: a local model and a real vLLM server, summary figures, JSONL and markdown transcripts."""

from __future__ import annotations

import json

import pytest

from trl_env import Ending, Rollout
from trl_env.backends.base import FinishReason
from trl_env.rollout.records import Turn
from trl_env.testing import save_tiny_model
from trl_env.tools.cli import main
from trl_env.tools.evaluate import summarize

GUESS = "experiment/examples/guess_number.py:GuessNumberEnv"


def run_eval(tmp_path, *source, n=12):
    out = tmp_path / "eval"
    status = main(["eval", "--env", GUESS, *source, "--n", str(n), "--seed-format", "game-{i}", "--max-turns", "3",
                   "--max-new-tokens", "6", "--parse-truncated-turns", "--out", str(out)])  # fmt: skip
    return status, out


def check_outputs(out, n):
    lines = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len(lines) == n and {line["seed"] for line in lines} == {f"game-{i}" for i in range(n)}
    assert all(line["turns"] and line["conversation"] for line in lines)
    markdown = (out / "transcripts.md").read_text()
    assert markdown.count("## Episode") == n and "turn 1 · model" in markdown and "turn 1 · env" in markdown
    assert "| mean_reward |" in (out / "summary.md").read_text()


def test_eval_with_a_local_model_writes_a_summary_and_transcripts(tmp_path, capsys):
    model_dir = save_tiny_model(tmp_path / "tiny")
    status, out = run_eval(tmp_path, "--model", str(model_dir))
    assert status == 0
    printed = capsys.readouterr().out
    assert "| episodes | 12 |" in printed and "| error_rate | 0 |" in printed
    check_outputs(out, 12)


def test_eval_against_a_real_vllm_server(tmp_path, vllm_server):
    status, out = run_eval(tmp_path, "--base-url", vllm_server.base_url, n=16)
    assert status == 0
    check_outputs(out, 16)


def test_eval_refuses_bad_arguments_with_a_message(tmp_path, capsys):
    assert main(["eval", "--env", "no_colon_here"]) == 2
    assert "expected 'module.path:EnvClass'" in capsys.readouterr().err
    assert main(["eval", "--env", GUESS]) == 2
    assert "--base-url URL" in capsys.readouterr().err


def test_summary_figures():
    def rollout(reward, ending, turns=1):
        turn = Turn("t", "", "a", "d", reward, FinishReason.STOP, 2, 1, 0.0, 0.0)
        return Rollout.single("s", [1], [5, 6, 7], [0.0] * 3, [1, 1, 0], (turn,) * turns, reward, ending)

    s = summarize([rollout(1.0, Ending.ENV_DONE, 2), rollout(0.0, Ending.MAX_TURNS), rollout(None, Ending.ERROR)],
                  wall_s=1.0)  # fmt: skip
    assert s.mean_reward == 0.5 and s.success_rate == pytest.approx(1 / 3) and s.error_rate == pytest.approx(1 / 3)
    assert s.truncation_rate == pytest.approx(1 / 3) and s.mean_turns == pytest.approx(4 / 3)
    assert s.mean_model_tokens == 2 and s.mean_completion_tokens == 3


KW_ENV = """
import time


class KwEnv:
    def __init__(self, target=0, hang=0.0):
        self.target, self.hang, self.reward, self.alive = target, hang, 0.0, True

    def reset(self, seed):
        time.sleep(self.hang)
        return self, f"target={self.target}"

    def step(self, action):
        self.alive = False
        return self, f"got {action!r}"
"""


def test_eval_passes_env_kwargs_and_the_engine_options(tmp_path, capsys):
    (tmp_path / "kw_env.py").write_text(KW_ENV)
    model_dir = save_tiny_model(tmp_path / "tiny")
    env, out = f"{tmp_path / 'kw_env.py'}:KwEnv", tmp_path / "eval"
    common = ["eval", "--env", env, "--model", str(model_dir), "--n", "4", "--max-new-tokens", "4", "--out", str(out)]
    assert main([*common, "--env-kwargs", '{"target": 7}', "--env-workers", "2"]) == 0
    assert all("target=7" in line for line in (out / "transcripts.jsonl").read_text().splitlines())
    capsys.readouterr()
    assert main([*common, "--env-kwargs", '{"hang": 30}', "--env-timeout", "0.5"]) == 0  # every reset hangs
    assert "| error_rate | 1 |" in capsys.readouterr().out
    assert main([*common, "--env-kwargs", "[1, 2]"]) == 2
    assert "--env-kwargs" in capsys.readouterr().err


def test_eval_builds_the_processor_with_action_tags_or_from_the_tokenizer(tmp_path):
    from trl_env.render.processors import TemplateProcessor
    from trl_env.tools.cli import build_parser, processor_from_args

    tokenizer = __import__("trl_env.testing.templates", fromlist=["x"]).trl_template_tokenizer("phi3")
    args = build_parser().parse_args(["eval", "--env", GUESS, "--action-tags", "<answer>,</answer>"])
    assert processor_from_args(args, tokenizer).action_tags == ("<answer>", "</answer>")
    args = build_parser().parse_args(["eval", "--env", GUESS, "--processor", "auto", "--system-prompt", "S"])
    processor = processor_from_args(args, tokenizer)
    assert isinstance(processor, TemplateProcessor) and processor.init_system_input("u").startswith("<|system|>\nS")


def test_eval_with_a_missing_model_folder_names_it(tmp_path, capsys):
    assert main(["eval", "--env", GUESS, "--model", str(tmp_path / "tiny")]) == 2
    assert "no model" in capsys.readouterr().err


def test_eval_runs_the_offline_tiny_model_by_name_from_any_folder(tmp_path, capsys, monkeypatch):
    import os

    guess = os.path.abspath(GUESS.split(":")[0]) + ":GuessNumberEnv"
    monkeypatch.chdir(tmp_path)  # no "tiny" folder here: the name, not a path
    status = main(["eval", "--env", guess, "--model", "tiny", "--n", "4", "--max-turns", "2",
                   "--max-new-tokens", "4", "--parse-truncated-turns"])  # fmt: skip
    assert status == 0 and "| episodes | 4 |" in capsys.readouterr().out


def test_eval_runs_envs_in_worker_processes_with_the_executor_option(tmp_path, capsys):
    model_dir = save_tiny_model(tmp_path / "tiny")
    status, _ = run_eval(tmp_path, "--model", str(model_dir), "--executor", "process", n=4)
    assert status == 0
    printed = capsys.readouterr().out
    assert "| episodes | 4 |" in printed and "| error_rate | 0 |" in printed


def test_eval_passes_history_and_template_kwargs_and_counts_tokens_over_rows(tmp_path, capsys, monkeypatch):
    import trl_env.rollout

    model_dir = save_tiny_model(tmp_path / "tiny")
    seen, batch_rollout = [], trl_env.rollout.batch_rollout

    def spy(*args, **kwargs):
        seen.append(kwargs)
        rollouts = batch_rollout(*args, **kwargs)
        seen[-1]["rollouts"] = rollouts
        return rollouts

    monkeypatch.setattr(trl_env.rollout, "batch_rollout", spy)
    common = ["eval", "--env", GUESS, "--model", str(model_dir), "--n", "6", "--max-turns", "3", "--max-new-tokens",
              "6", "--parse-truncated-turns", "--processor", "auto"]  # fmt: skip
    assert main(common) == 0
    assert seen[-1]["history"] == "sampled" and seen[-1]["template_kwargs"] is None  # the default, unchanged
    assert main([*common, "--history", "deployed", "--template-kwargs", '{"enable_thinking": false}']) == 0
    assert seen[-1]["history"] == "deployed" and seen[-1]["template_kwargs"] == {"enable_thinking": False}
    rollouts = seen[-1]["rollouts"]
    model_tokens = sum(t.num_model_tokens for r in rollouts for t in r.turns) / len(rollouts)
    printed = capsys.readouterr().out
    assert f"| mean_model_tokens | {model_tokens:.4g} |" in printed  # every row's sampled tokens, not the last row's


def test_eval_refuses_deployed_history_without_a_chat_template(tmp_path, capsys):
    from transformers import AutoTokenizer

    model_dir = save_tiny_model(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "bare")
    for name in ("chat_template.jinja", "chat_template.json"):
        (tmp_path / "bare" / name).unlink(missing_ok=True)
    args = ["eval", "--env", GUESS, "--model", str(model_dir), "--tokenizer", str(tmp_path / "bare"), "--n", "2"]
    assert main([*args, "--history", "deployed"]) == 2
    assert "chat template" in capsys.readouterr().err
    assert main([*args, "--history", "deployed", "--template-kwargs", "[1]"]) == 2
    assert "--template-kwargs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--history", "rendered"])
