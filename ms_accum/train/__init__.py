"""Training: the executor, its runners and windows, records, schedules, checkpoints and resume."""
