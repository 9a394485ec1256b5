"""The embedded ``torch`` runtime: HF checkpoints run with PyTorch inside Triton python models."""
