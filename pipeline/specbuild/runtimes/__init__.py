"""Runtimes: how each backend converts checkpoints, builds engines and describes its engine models."""
