import pickle

import pytest

from trl_env import ConfigError, EnvError, ProcessorError, ServerError, TrlEnvError


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (ConfigError("bad value"), (TrlEnvError, ValueError)),
        (ProcessorError("bad processor"), (TrlEnvError, ValueError)),
        (EnvError("env failed", env_index=3, turn=2, method="step"), (TrlEnvError, RuntimeError)),
        (
            ServerError("down", url="http://127.0.0.1:8000", status_code=503, body="x" * 5000),
            (TrlEnvError, RuntimeError),
        ),
    ],
)
def test_errors_keep_their_stdlib_base_and_survive_pickling_with_context(error, bases):
    assert isinstance(error, bases)
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error) and str(clone) == str(error) and clone.__dict__ == error.__dict__


def test_error_context_is_stored():
    error = EnvError("x", env_index=3, turn=2, method="step")
    assert (error.env_index, error.turn, error.method) == (3, 2, "step")
    assert len(ServerError("x", body="y" * 5000).body) == 2000
