"""What was done: the run directory, the journal, checkpoints and summaries. Knows no job file."""
