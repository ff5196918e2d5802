"""The rollout engine: batch_rollout (engine.py), one episode's state and calls (calls.py), records (records.py)."""

from trl_env.render.history import History
from trl_env.rollout.engine import batch_rollout
from trl_env.rollout.records import Budgets, Ending, Rollout, Row, Span, Turn

__all__ = ["Budgets", "Ending", "History", "Rollout", "Row", "Span", "Turn", "batch_rollout"]
