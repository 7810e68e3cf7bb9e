"""Training demos: datasets, models, the training loop, checkpoints and reports."""
