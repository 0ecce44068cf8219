"""Digests: configuration fingerprints, content digests of data and functions, value digests.

A leaf below ``ops/``, ``sources/`` and ``checkpoint/``: each of them digests what it
owns with these, and ``checkpoint/`` compares the digests on restore.
"""
