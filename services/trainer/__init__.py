"""The trainer service: batch assembly, old-policy scoring, loss, optimiser step, checkpoints, publishing."""
