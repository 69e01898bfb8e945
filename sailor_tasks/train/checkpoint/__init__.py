"""Atomic, verified checkpoints: ``store`` (torch-free: layout, markers, verification, copy,
retention) and ``dcp`` (the torch.distributed.checkpoint writer, reader and ``CheckpointManager``)."""
