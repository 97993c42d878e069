"""The op set: every operation the engine needs, one name each, on either device (phase T07).

autograd/, model/ and training/ call these names and never ask which device runs them. Each op
chooses its kernel from its arrays, here and nowhere else:

  * CPU (float32 NumPy arrays): C++ on the engine's worker pool (runtime/host/fused_rows.cpp) and
    BLAS (runtime/blas.py: MKL's sgemm or NumPy's), on fixed blocks of rows: the same bits for
    any thread count;
  * GPU (CuPy arrays of float32, bfloat16 or float16): the CUDA C of runtime/kernels/, one launch
    each through CuPy, and cuBLAS (runtime/gpu_blas.py);
  * the NumPy reference where no compiled kernel applies (float64, a layout a kernel does not
    take, no C++ compiler, XTRAIN_FUSED=0), written once against the array module.

    from xtrain_lessons.runtime import opset
    y = opset.matmul(x, w.T)                       # cuBLAS, or BLAS on the CPU's threads
    opset.rmsnorm_fwd(x, w, xhat, out, r, eps)     # a CUDA kernel, C++ rows, or NumPy rows

`table.OPS` lists every op with its CPU kernel, GPU kernel, reference and test; `table.markdown()`
prints it (CONTRIBUTING.md's op table).
"""

from xtrain_lessons.runtime.opset.attention import causal_attention_bwd, causal_attention_fwd, causal_softmax_bwd, \
    causal_softmax_fwd
from xtrain_lessons.runtime.opset.casts import cast
from xtrain_lessons.runtime.opset.classifier import check_targets, cross_entropy_bwd, cross_entropy_fwd, \
    linear_cross_entropy_bwd, linear_cross_entropy_fwd
from xtrain_lessons.runtime.opset.dropout import uniforms
from xtrain_lessons.runtime.opset.embedding import embedding_bwd
from xtrain_lessons.runtime.opset.flash import flash_kernels, flash_kernels_for
from xtrain_lessons.runtime.opset.moves import move_to, to_device, to_device_of, to_host
from xtrain_lessons.runtime.opset.optim import NORM_GRID, Segment, adamw, adamw_step_scalars, grad_norm, \
    grad_norm_and_clip, loss_scale_update, scale_arrays
from xtrain_lessons.runtime.opset.products import matmul, matmuls
from xtrain_lessons.runtime.opset.rows import add, rmsnorm_bwd, rmsnorm_fwd, rope, scale_rows, softmax_rows, \
    swiglu_bwd, swiglu_fwd
from xtrain_lessons.runtime.opset.table import OPS, markdown
from xtrain_lessons.runtime.opset.threads import placement, threads_set

__all__ = ["OPS", "markdown", "matmul", "matmuls", "rmsnorm_fwd", "rmsnorm_bwd", "swiglu_fwd", "swiglu_bwd", "rope",
           "add", "softmax_rows", "scale_rows", "causal_softmax_fwd", "causal_softmax_bwd", "causal_attention_fwd",
           "causal_attention_bwd", "flash_kernels", "flash_kernels_for", "check_targets", "cross_entropy_fwd", "cross_entropy_bwd", "linear_cross_entropy_fwd",
           "linear_cross_entropy_bwd", "embedding_bwd", "cast", "uniforms", "Segment", "adamw",
           "adamw_step_scalars", "grad_norm", "scale_arrays", "grad_norm_and_clip", "loss_scale_update", "NORM_GRID",
           "threads_set", "placement", "to_host", "to_device", "move_to", "to_device_of"]
