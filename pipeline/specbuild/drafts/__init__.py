"""Making drafts: distillation (``specbuild draft``), its prompts and evaluation, the demo and tiny pairs."""
