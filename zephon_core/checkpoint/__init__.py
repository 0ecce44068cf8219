"""Checkpoint schema, codec, fingerprint and the replay filter."""
