"""Command-line tools: ``trl-env eval`` (evaluate.py), ``trl-env additivity`` (additivity.py); cli.py parses."""
