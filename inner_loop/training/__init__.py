"""One training run's stages: set-up (the config, splits, model and trainer), the format warm-up, checkpoints, the
progress log, intermediate and final evaluation, the training diagnostics, the final model, and scoring a finished
run on another task (transfer)."""
