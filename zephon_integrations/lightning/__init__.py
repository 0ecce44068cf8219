"""Lightning integration: :class:`ZephonDataModule`."""

from .datamodule import ZephonDataModule

__all__ = ["ZephonDataModule"]
