"""Layer 2, autograd: the tape (`tensor`), the differentiable ops (`ops`) and `gradcheck`.

May import only `runtime`. Importing this package attaches the ops to `Tensor` as methods and
operators (`x @ w`, `x.sum()`), so `from xtrain_lessons.autograd.tensor import Tensor` always
gives the full Tensor.
"""

from xtrain_lessons.autograd import ops  # noqa: F401  (attaches operators and methods to Tensor)
