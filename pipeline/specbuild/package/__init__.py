"""Packaging a release: the tensor contract, the Triton repository renderer and the manifest."""
