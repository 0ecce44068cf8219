"""Topology, lane assignment and multi-rank checkpoint aggregation."""
