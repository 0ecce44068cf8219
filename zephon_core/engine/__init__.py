"""Compile, stages, runners, pump, lanes."""
