"""specbuild: compile a target/draft checkpoint pair into a Triton repository that serves speculative decoding."""

__version__ = "0.1.0"
