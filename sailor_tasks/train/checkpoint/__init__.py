"""Atomic, verified checkpoints: the torch-free store (markers, checksums, retention, copy) and the
torch.distributed.checkpoint writer and reader."""
