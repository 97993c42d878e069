"""Every kernel compiles with CuPy's own compiler, NVRTC, exactly as `Kernel` asks for it on a GPU.

NVRTC needs no GPU: `cupy-cuda12x` with `nvidia-cuda-nvrtc-cu12` (the compiler) and
`nvidia-cuda-runtime-cu12` (cuda_bf16.h, cuda_fp16.h) compile CUDA C to PTX on any machine.
The options are the ones `cupy.RawKernel` builds from ours (CuPy's include folders, the CUDA
headers it finds at run time, -ftz=true, --device-as-default-execution-space) plus an
architecture, which a GPU would supply. This catches what nvcc forgives and NVRTC does not
(nvcc includes math.h implicitly, so INFINITY compiled there and failed on a learner's GPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xtrain_lessons.runtime.cuda import KERNELS_DIR, gpu_options

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [*sorted(KERNELS_DIR.glob("*.cu")), *sorted((ROOT / "tests" / "cuda_kernels").glob("*.cu"))]
ARCH = "-arch=compute_80"


def _nvrtc():
    try:
        from cupy._core import core
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
        core.assemble_cupy_compiler_options  # how RawKernel builds its options (CuPy >= 13)
        return core, nvrtc
    except Exception as e:  # not installed, or no libnvrtc: the reason goes into the skip
        pytest.skip(f"CuPy's NVRTC is not usable here ({type(e).__name__}: {e}); "
                    "pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12")


def nvrtc_compile(source: str, filename: str, options=(), name_expressions=()) -> str:
    """PTX for `source`, compiled as cupy.RawKernel/RawModule would on a GPU; raise with the log."""
    core, nvrtc = _nvrtc()
    opts = core.assemble_cupy_compiler_options(tuple(options))
    opts += ("-ftz=true", ARCH, "--device-as-default-execution-space")
    prog = nvrtc.createProgram(source, Path(filename).name, (), ())
    try:
        for expr in name_expressions:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, list(opts))
        except nvrtc.NVRTCError:
            raise AssertionError(f"NVRTC rejected {Path(filename).name}:\n{nvrtc.getProgramLog(prog)}") from None
        ptx = nvrtc.getPTX(prog)
        return ptx.decode() if isinstance(ptx, bytes) else ptx
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nvrtc_compiles_every_kernel(source):
    ptx = nvrtc_compile(source.read_text(), str(source), gpu_options((), str(source)))
    assert ".entry" in ptx


def _gemm_option_sets():
    from xtrain_lessons.runtime.kernels.gemm import DEFAULTS, launch_config
    return [launch_config(v, 100, 100)[2] for v in sorted(DEFAULTS)]


@pytest.mark.parametrize("options", _gemm_option_sets(), ids=lambda o: " ".join(o) or "default")
def test_nvrtc_compiles_gemm_with_its_launch_options(options):
    path = KERNELS_DIR / "gemm.cu"
    assert ".entry" in nvrtc_compile(path.read_text(), str(path), gpu_options(options, str(path)))


def test_nvrtc_rejects_what_nvcc_forgives():
    """The check can fail: INFINITY without math.h is the error T14's kernel had."""
    src = 'extern "C" __global__ void k(float* x) { x[0] = -INFINITY; }'
    with pytest.raises(AssertionError, match="INFINITY"):
        nvrtc_compile(src, "k.cu")


def test_nvrtc_compiles_template_kernels_by_name_expression():
    """The name expressions the emulator's tests launch compile to entries with NVRTC too."""
    path = ROOT / "tests" / "cuda_kernels" / "real_world.cu"
    ptx = nvrtc_compile(path.read_text(), str(path), gpu_options((), str(path)),
                        name_expressions=("block_sum_t<float, 128>", "block_sum_t<double, 64>"))
    assert ptx.count(".entry") >= 10  # the 8 extern "C" kernels and both instantiations


def _step_families():
    """(.cu file, name expressions) of the GPU engine's templated kernel families (T07b)."""
    from xtrain_lessons.runtime.kernels import cross_entropy, embedding, residual, rmsnorm, rope, softmax, swiglu
    return [(m.__name__.rsplit(".", 1)[1] + ".cu", m.NAME_EXPRESSIONS)
            for m in (rmsnorm, swiglu, rope, softmax, cross_entropy, residual, embedding)]


@pytest.mark.parametrize("filename,expressions", _step_families(), ids=lambda v: v if isinstance(v, str) else "")
def test_nvrtc_compiles_every_instantiation_the_launchers_use(filename, expressions):
    """Every template name expression a launcher asks for compiles with NVRTC, and is one of the
    file's explicit instantiations (so nvcc and a plain NVRTC compile see the same kernels: asking
    for the expressions adds no entry)."""
    path = KERNELS_DIR / filename
    opts = gpu_options((), str(path))
    templates = [e for e in expressions if "<" in e]
    assert templates, f"{filename}: no template name expressions"
    named = nvrtc_compile(path.read_text(), str(path), opts, name_expressions=templates)
    plain = nvrtc_compile(path.read_text(), str(path), opts)
    assert named.count(".entry") >= len(templates)
    assert named.count(".entry") == plain.count(".entry"), \
        f"{filename}: a launcher's name expression is missing from the file's explicit instantiations"


@pytest.mark.parametrize("bucket", [64, 128], ids=lambda b: f"DP={b}")
def test_nvrtc_compiles_the_tensor_core_flash_kernels_as_the_launcher_asks(bucket):
    """flash_attention_tc.cu's templates, instantiated by the launcher's name expressions for one
    head-dim bucket (as `_kernel` compiles them on a GPU): the two tile configurations (DP <= 64,
    DP > 64). The plain compile above sees only flash_tc_bwd_prep: the file instantiates its
    buckets explicitly for nvcc alone."""
    from xtrain_lessons.runtime.kernels.flash_attention_tc import NAME_EXPRESSIONS
    path = KERNELS_DIR / "flash_attention_tc.cu"
    exprs = [e for e in NAME_EXPRESSIONS if e.endswith(f"<{bucket}>")]
    ptx = nvrtc_compile(path.read_text(), str(path), gpu_options((), str(path)), name_expressions=exprs)
    assert ptx.count(".entry") == len(exprs) + 1 and "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
