"""Hugging Face integration: datasets as mixture components, and the Trainer.

``ZephonCallback`` drops into any ``transformers.Trainer``; ``ZephonTrainer`` is the
per-rank path for scale (see the README for which to use when). Both need the ``hf``
extra; the datasets adapter needs only ``datasets``.
"""

from .datasets_adapter import HFComponent, hf_component, hf_components

__all__ = ["HFComponent", "ZephonCallback", "ZephonTrainer", "hf_component", "hf_components"]


def __getattr__(name: str):
    # lazy: importing transformers costs seconds and is not needed for datasets alone
    if name == "ZephonCallback":
        from .callback import ZephonCallback

        return ZephonCallback
    if name == "ZephonTrainer":
        from .trainer import ZephonTrainer

        return ZephonTrainer
    raise AttributeError(name)
