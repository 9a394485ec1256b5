"""Runtimes: how each backend converts checkpoints, builds engines and describes its engine models."""

# Written by both runtimes into every engine folder; packaging reads it (see repository.EngineInfo).
BUILD_INFO = "build_info.json"
