"""Intervals that several sections share (the ``RANGES`` of ``ranges`` and of the controller
sections), written as in mathematics: ``"(0, 1]"``."""

SEED = "[0, 4294967295]"  # numpy's seed range (2**32 - 1)
STEPS = "[1, 100000000]"
TOKENS = "[1, 1048576]"  # lengths in tokens; 2**20 is beyond any model's context
SAMPLES = "[1, 4096]"  # responses per prompt
TEMPERATURE = "(0, 100]"
