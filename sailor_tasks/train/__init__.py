"""Training: the ``python -m sailor_tasks.train`` entrypoint, trainer, checkpoints, models, data."""
