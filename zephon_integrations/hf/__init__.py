"""Hugging Face integration: datasets as mixture components."""

from .datasets_adapter import HFComponent, hf_component, hf_components

__all__ = ["HFComponent", "hf_component", "hf_components"]
