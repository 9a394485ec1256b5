"""Packaging a release: the tensor contracts (the ensemble's, the engine backend's), the Triton repository
renderer, the specbuild modules shipped with each python model, and the manifest."""
