"""Runtimes: how a release is built and served, behind one interface (:mod:`specbuild.runtimes.interface`),
looked up by name in :mod:`specbuild.runtimes.registry`; one folder per runtime owns everything specific to it."""
