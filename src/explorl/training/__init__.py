"""The training loop and its phases: sample, score, advantages, update, controllers, log.

``loop`` holds the ``Trainer`` (one step in numbered sections); each phase is a module beside it.
"""
