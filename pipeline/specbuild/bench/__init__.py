"""Measuring a served release: ``bench`` (interleaved cells, metrics, reports), ``tune`` and the prompt sets."""

# The bundled workloads' files, here so that code without pydantic (the GPU scripts) can read them too.
BUNDLED: dict[str, str] = {"general": "bundled_prompts.jsonl", "structured": "structured_prompts.jsonl"}
