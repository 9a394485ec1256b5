"""Serving a release: the bundled Triton server, launch plans, Kubernetes manifests, clients and the Triton
python models (``triton_models/``)."""
