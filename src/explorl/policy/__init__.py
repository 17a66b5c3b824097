"""The policy's forward passes, shared by the sampler and the trainer: ``lean`` (the decoder's
own ops for Llama-family models, used by the ``hf`` engine's sampling and the loss pass's packed
layout) and ``forward`` (log-probs and entropy of given responses: the loss's forward, the
engines' probe and EEPO's unlearning step)."""
