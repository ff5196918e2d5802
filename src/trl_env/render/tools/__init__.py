"""Native tool calling: tools as an env (``ToolEnv``), and a processor that speaks the template's own tool format.

``ToolFormat.read`` reads a chat template's tool-calling format off the template (its opening with the
tools, the token that ends a call, how results are written, a parser for calls); ``ToolProcessor``
renders and parses with it; ``ToolEnv`` runs the calls. See docs/tools.md.
"""

from trl_env.render.tools.types import ToolCall, ToolCalls, ToolResult, ToolResults

__all__ = ["ToolCall", "ToolCalls", "ToolResult", "ToolResults"]
