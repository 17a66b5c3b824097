"""What a run writes: the metrics file and progress bar, completions, trackers and console
tables."""
