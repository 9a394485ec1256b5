"""Checking a target/draft pair: compatibility, the memory plan and the report (each checkpoint read by
:mod:`specbuild.checkpoint`)."""
