"""Built-in collators: stack and pad an encoded batch into NumPy, torch or TF tensors.

All three share ``ArrayCollator``'s NumPy stacking and differ only in the final
conversion. Importing this package imports neither torch nor tensorflow.
"""
from ._image import Images
from ._numpy import NumpyCollator
from ._tf import TFCollator
from ._torch import TorchCollator

__all__ = ["NumpyCollator", "TorchCollator", "TFCollator", "Images"]
