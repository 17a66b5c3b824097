"""The base class of every error a user can cause (config, data, model path, controller, reward).

The CLI prints these as one ``error: …`` line and exits 2; anything else is a bug in explorl.
"""

from __future__ import annotations


class ExplorlError(Exception):
    """A problem with the user's input, reported without a traceback by the CLI."""
