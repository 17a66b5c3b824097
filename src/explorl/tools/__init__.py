"""Tools for multi-turn rollouts: typed functions (``functions``), the formats a model writes
calls in (``formats``), and calls run in the sandboxed worker pool (``runner``)."""

from explorl.tools.functions import ToolCallError, call, check_tool, load_tool, schema
from explorl.tools.runner import ToolAnswer, ToolRunner, ToolSpec

__all__ = ["ToolAnswer", "ToolCallError", "ToolRunner", "ToolSpec", "call", "check_tool",
           "load_tool", "schema"]
