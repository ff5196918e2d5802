"""Issue 47 item 5: the ``trl-env`` CLI. A chat-template option for ``eval`` (a TRL template name or a file), help
text and a shown default for every option, and one path form (``module.path:Name`` or ``path/to/file.py:Name``) for
both ``--env`` and ``--seats``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from trl_env import ConfigError
from trl_env.testing.templates import trl_templates
from trl_env.tools.cli import build_parser, chat_template, main
from trl_env.tools.evaluate import load_env_factory

GUESS = "experiment/examples/guess_number.py:GuessNumberEnv"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", ["eval", "additivity"])
def test_every_option_has_help_and_shows_its_default(command):
    parser = subcommands()[command]
    text = parser.format_help()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{command} {action.option_strings} has no help"
        if action.default not in (None, False):
            assert f"(default: {action.default})" in " ".join(text.split()), (command, action.option_strings)


def test_chat_template_takes_a_trl_template_name_or_a_file(tmp_path):
    assert chat_template("qwen2_5") == trl_templates()["qwen2_5"]
    path = tmp_path / "mine.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert chat_template(str(path)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ConfigError, match="no such file, nor a template TRL ships.*qwen2_5"):
        chat_template("no_such_template")


def test_eval_runs_with_the_chat_template_it_is_given(tmp_path, capsys):
    out = tmp_path / "eval"
    common = ["eval", "--env", GUESS, "--model", "tiny", "--n", "2", "--max-turns", "2", "--max-new-tokens", "4"]
    common += ["--parse-truncated-turns", "--processor", "auto", "--out", str(out)]
    mine = tmp_path / "system_first.jinja"  # the tiny model's ChatML, with a fixed system line the default lacks
    mine.write_text(
        "<|im_start|>system\nPlay well.<|im_end|>\n{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert main([*common, "--chat-template", str(mine)]) == 0
    first = json.loads((out / "transcripts.jsonl").read_text().splitlines()[0])
    assert "Play well." in json.dumps(first["conversation"]) or "Play well." in (out / "transcripts.md").read_text()
    assert main([*common, "--chat-template", "no_such_template"]) == 2
    assert "--chat-template 'no_such_template'" in capsys.readouterr().err


def test_env_and_seats_take_both_path_forms(tmp_path):
    module_form = load_env_factory("trl_env.adapters.textarena_seats:random_move", "--seats")
    file_form = load_env_factory("src/trl_env/adapters/textarena_seats.py:random_move", "--seats")
    assert module_form.__name__ == file_form.__name__ == "random_move"
    assert load_env_factory("trl_env.adapters.textarena_seats:TextArenaGame").__name__ == "TextArenaGame"
    assert load_env_factory(GUESS).__name__ == "GuessNumberEnv"
    with pytest.raises(ConfigError, match="--seats 'no.such.module:f': no module"):
        load_env_factory("no.such.module:f", "--seats")
    with pytest.raises(ConfigError, match="--seats 'missing.py:f': file 'missing.py' does not exist"):
        load_env_factory("missing.py:f", "--seats")
    assert Path("src/trl_env/adapters/textarena_seats.py").exists()
