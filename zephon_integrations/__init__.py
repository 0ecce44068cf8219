"""Zephon integrations (Lightning, Hugging Face)."""
