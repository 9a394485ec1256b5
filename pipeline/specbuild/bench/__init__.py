"""Measuring a served release: ``bench`` (interleaved cells, metrics, reports), ``tune`` and the prompt sets."""
