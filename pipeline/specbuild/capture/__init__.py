"""Captured traffic: what a release that captures (opt-in) wrote of each finished request, and how it is read."""
