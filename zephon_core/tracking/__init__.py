"""Offset tracking, eviction and the per-lane ledger."""
