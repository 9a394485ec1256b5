"""Serving a release from outside Triton: the bundled Triton server, launching a compiled release as its runtime
plans it, Kubernetes manifests, the clients and the OpenAI-compatible API."""
