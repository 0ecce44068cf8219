"""Checkpoint states: schema, codec, restore admission, re-mixing, resized datasets."""
