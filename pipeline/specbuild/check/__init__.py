"""Checking a target/draft pair: checkpoint reading, compatibility, the memory plan and the report."""
