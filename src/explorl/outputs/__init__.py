"""What a run writes: the metrics file and progress bar, completions, atomic checkpoints, trackers
and console tables."""
