"""Old import path of the training-step rows' reader, kept only until pages/training.py imports
``read_rows`` from ``kernels.measure.train.store``; then delete this file. The training-step
measurement is the package ``kernels.measure.train`` (its ``__init__`` says which file does
what).
"""

from kernels.measure.train.store import read_rows

__all__ = ["read_rows"]
