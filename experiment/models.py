"""The offline models of the examples; they live in the package (``trl_env.testing.models``) so the CLI has them too."""

from trl_env.testing.models import (  # noqa: F401  # re-exported for the examples and tests
    DEFAULT_MODEL,
    load_model_and_tokenizer,
    prepare_smollm2,
    resolve_model,
)
