"""The speculative core: the acceptance rules, the loop, draft sources and the torch engine (pure PyTorch)."""
