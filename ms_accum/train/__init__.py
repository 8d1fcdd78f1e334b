"""Training: the executor, its structures, runs and windows, records, schedules, checkpoints and resume."""
