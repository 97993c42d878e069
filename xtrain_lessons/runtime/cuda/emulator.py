"""The CPU emulator: run CUDA C kernels on the host by compiling them with g++.

How a kernel runs
-----------------
1. The `.cu` source is prepared: `__shared__` declarations are rewritten into lookups in a
   per-block arena, a `#line` directive keeps the user's file name and line numbers, and one
   `extern "C"` launcher per `__global__` function is appended. The launcher takes `void** args`
   exactly as `cudaLaunchKernel` does and unpacks them by the kernel's parameter types
   (a variadic template deduces them from the function pointer).
2. g++ compiles it (`-std=c++20 -O2 -shared -fPIC`, `-include xtrain_cuda_compat.h`) into a
   shared library, cached by a hash of (source, headers, flags, compiler version) in
   $XTRAIN_CACHE_DIR or ~/.cache/xtrain-lessons/kernels. The header is light, so a kernel
   compiles in well under a second; the scheduler lives in a runtime library
   (xtrain_emulator_runtime.h) compiled once per machine, which every kernel library links.
   Inline PTX (`asm volatile("mma.sync...")`) is rewritten into the emulator's call of the same
   instruction first (rewrite_asm).
3. ctypes loads it; each call checks the arguments against the parameter types exported by the
   library, then launches: blocks are spread over a few OS threads (one per core,
   $XTRAIN_EMULATOR_WORKERS); inside a block every CUDA thread is a fiber — a user-space
   stack. A fiber runs until it reaches `__syncthreads()` or a warp operation, then hands over
   directly to the next runnable fiber (a hand-written x86-64 stack switch; swapcontext
   elsewhere); the last one returns to the scheduler, which completes the barrier. Kernels with
   no barrier and no warp operation in their source take a fast path: a block's threads are
   plain calls in a loop.

$XTRAIN_EMULATOR_MODE picks how the threads of a block run: `fibers` (default), `ucontext`
(the same fibers switched with POSIX swapcontext: portable, ~6x slower) or `threads` (one
std::thread per CUDA thread, all running in parallel; a barrier is a mutex and condition
variables: only needs C++20, real races between threads, and much slower — see
scripts/bench_emulator.py). The three share the barrier rules, so they give the same results
and the same error reports.

Checks the emulator makes
-------------------------
* Shared memory is filled with 0xFF bytes (a NaN for floats, -1 for ints) before every block,
  so reading shared memory nobody wrote shows up in the result.
* A `__syncthreads()` that can never complete, or that different threads reach at different
  source lines, raises `KernelError` naming the block, the threads and the lines. So does a
  warp whose lanes wait at different kinds of warp operation.
* Arguments are checked: a float64 array for a `float*`, an np.float64 for a `float`, a
  non-contiguous or read-only array, or a Python int/float (CuPy would pass them as 64-bit
  values) raise `TypeError`/`ValueError` naming the parameter.
* `__trap()` raises `KernelError` with the block, thread and line.

The sanitizer (`sanitize=True`, $XTRAIN_SANITIZE=1)
---------------------------------------------------
Compiled with -DXT_SANITIZE, run with one worker and fibers (one thread at a time):
* Global memory: each array argument is copied into a mapping whose data ends where 64 KB of
  inaccessible guard pages begin (copied back afterwards). The first access past the end
  faults; a SIGSEGV handler, installed only during the launch, names the parameter, index,
  size, block and thread, and tells a read from a write (the page-fault error code). An array
  passed twice shares one copy; arrays that partly overlap are passed unchecked. Not seen:
  a small negative index (it lands in the data's own page), an index past the guard pages,
  out-of-row accesses that stay inside the array.
* Shared memory: the `__shared__` declarations become checked views (xtrain_sanitizer.h):
  every index is bounds-checked per dimension, and every read and write of a number goes
  through a shadow that records, per byte, the block that last wrote it and the threads that
  last wrote and read it with their barrier epoch. A read of a byte this block never wrote,
  or two threads (one writing) on one byte between the same two barriers, is reported; lanes
  of a warp that met at a warp operation in between do not race. Accesses through a plain
  pointer into shared memory (`float* p = tile[0];`, `&s[i]` for atomics) are not checked.
* Cost: see scripts/bench_emulator.py (several times slower on barrier-heavy kernels).

Where the emulator differs from a GPU (fidelity limits)
-------------------------------------------------------
* No warp lockstep: the threads of a warp run one after another between synchronisation
  points, so code that relies on implicit warp-synchronous execution (no `__syncwarp`) is wrong
  here, as it is on Volta and later GPUs.
* Memory ordering is stronger: with fibers the threads of a block run one at a time, so most
  data races between them are invisible; the NaN-filled shared memory catches the common
  missing-barrier bug, not every race (`threads` mode makes races real, but rarely visible).
  Races between blocks are real (blocks run in parallel) but also rarely observable.
* Warp masks are ignored: a warp operation waits for every live lane of the warp.
* Threads that have returned count as arrived at every later `__syncthreads()` (early return
  does not deadlock). In CUDA a barrier not reached by every thread is undefined behaviour.
* No bounds checks outside sanitizer mode: an out-of-range index reads or writes host memory
  (it may crash Python).
  A fiber has a 124 KB stack (a GPU thread has 1 KB by default); deep recursion or big local
  arrays overflow it (a crash). Dynamic shared memory is not limited to 48 KB.
  A thread stuck in an endless loop hangs the launch, as on a GPU (Ctrl-C cannot stop it).
* `__constant__` and `__device__` variables are ordinary globals of the library, set from
  Python through `Module.get_global` / `set_global`; `__constant__` is not read-only here.
  A kernel's `printf` output is copied to Python's sys.stdout when the launch ends (so that
  Jupyter shows it); lines from different blocks come in any order, as on a GPU.
* Inline PTX: the one instruction understood is the tensor cores' `mma.sync.aligned.m16n8k16`
  (.row.col, bf16 or f16 operands, f32 accumulators), rewritten into a warp-collective call
  (include/xtrain_mma.h: the fragment layout of the PTX ISA, all 32 lanes required, the sum
  rounded once to float32 where a tensor core may differ in the last bit). Any other `asm` is
  a compile error naming the instruction.
* Kernels are `__global__ void` functions, `extern "C"` as `cupy.RawKernel` requires, or
  templates launched by name expression through `Module`. `__shared__` at file scope is not
  supported. Cooperative groups: the thread block and tiles of up to 32 threads
  (include/cooperative_groups.h); no grid-wide groups.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import ml_dtypes
import numpy as np

EMULATOR_VERSION = "1"
INCLUDE_DIR = Path(__file__).resolve().parent / "include"
COMPAT_HEADER = "xtrain_cuda_compat.h"
RUNTIME_HEADER = "xtrain_emulator_runtime.h"
CXX_FLAGS = ("-std=c++20", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-pthread")
MODES = {"fibers": 0, "ucontext": 1, "threads": 2}
_SYNC_OPS = re.compile(r"\b(__syncthreads|__syncwarp|__shfl\w*|__ballot_sync|__any_sync|__all_sync|__activemask"
                       r"|cooperative_groups|this_thread_block|tiled_partition|asm|__asm__)\b")


class KernelError(RuntimeError):
    """A kernel failed at run time (deadlock, barrier divergence, ...)."""


class CompileError(KernelError):
    """The compiler rejected the kernel source; the message holds its output."""


# ------------------------------------------------------------------ source preparation
def strip_comments(src: str) -> str:
    """Blank out comments and string/char literals, keeping every newline (offsets still match)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""", blank, src, flags=re.S)


_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_KERNEL_RE = re.compile(r"__global__\s+" + _BOUNDS + r"void\s+" + _BOUNDS + r"([A-Za-z_]\w*)\s*\(")


def find_kernels(src: str) -> dict[str, tuple[int, int]]:
    """Map each `__global__ void name(` to the (start, end) of its body in the stripped source."""
    code = strip_comments(src)
    kernels = {}
    for m in _KERNEL_RE.finditer(code):
        depth, i = 0, m.end() - 1
        while i < len(code):  # skip the parameter list
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
            if depth == 0:
                break
        start = code.find("{", i)
        if start < 0 or code[i:start].strip():
            continue  # a declaration, not a definition
        depth, j = 0, start
        while j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
            if depth == 0:
                break
        kernels[m.group(1)] = (start, j)
    return kernels


def needs_fibers(src: str, name: str, included: str = "") -> bool:
    """True unless we are sure the kernel never reaches a barrier or warp operation.

    A kernel needs the fiber scheduler if its own body uses one, or if one is used anywhere
    outside the kernel bodies (a __device__ helper it might call, maybe in an included file)."""
    if _SYNC_OPS.search(strip_comments(included)):
        return True
    code = strip_comments(src)
    kernels = find_kernels(src)
    if name not in kernels:
        return bool(_SYNC_OPS.search(code))
    start, end = kernels[name]
    if _SYNC_OPS.search(code, start, end):
        return True
    outside = code
    for s, e in kernels.values():
        outside = outside[:s] + " " * (e - s) + outside[e:]
    return bool(_SYNC_OPS.search(outside))


def param_names(src: str, name: str) -> list[str]:
    """The parameter names of kernel `name`, in order (for the sanitizer's reports)."""
    code = strip_comments(src)
    for m in _KERNEL_RE.finditer(code):
        if m.group(1) != name:
            continue
        depth, i, parts, cur = 1, m.end(), [], ""
        while i < len(code) and depth:
            c = code[i]
            depth += {"(": 1, ")": -1, "<": 1, ">": -1}.get(c, 0)
            if depth == 1 and c == ",":
                parts.append(cur); cur = ""
            elif depth:
                cur += c
            i += 1
        parts.append(cur)
        names = [re.findall(r"[A-Za-z_]\w*", p.split("=")[0]) for p in parts if p.strip()]
        return [n[-1] if n else f"arg{k}" for k, n in enumerate(names)]
    return []


# ------------------------------------------------------------------ inline PTX
_ASM_RE = re.compile(r"\b(?:asm|__asm__)\s*(?:(?:volatile|__volatile__)\s*)?\(")
_MMA_RE = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(bf16|f16)\.(bf16|f16)\.f32")
SUPPORTED_PTX = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                 "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")


def _split_top(code: str, lo: int, hi: int, sep: str) -> list[tuple[int, int]]:
    """Spans of code[lo:hi] split at `sep` outside brackets (`code` has its strings blanked);
    a ':' that is half of '::' does not split."""
    spans, depth, start = [], 0, lo
    for i in range(lo, hi):
        c = code[i]
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(c, 0)
        if c == sep and depth == 0 and not (sep == ":" and ":" in (code[i - 1], code[i + 1:i + 2])):
            spans.append((start, i))
            start = i + 1
    spans.append((start, hi))
    return spans


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def _asm_call(src: str, code: str, lo: int, hi: int, line: int) -> str:
    """The emulator's C++ for the asm statement whose parentheses hold src[lo:hi]."""
    sections = _split_top(code, lo, hi, ":")
    template = "".join(_unescape(m.group(1)) for m in re.finditer(r'"((?:\\.|[^"\\])*)"', src[slice(*sections[0])]))
    operands = []  # (constraint, expression) in %N order: the outputs, then the inputs
    for a, b in sections[1:3]:
        for x, y in _split_top(code, a, b, ","):
            if src[x:y].strip():
                m = re.fullmatch(r'\s*"([^"]*)"\s*\((.*)\)\s*', src[x:y], re.S)
                if not m:
                    raise CompileError(f"line {line}: cannot read the asm operand {src[x:y].strip()!r}")
                operands.append((m.group(1), m.group(2)))
    text = " ".join(template.split())
    opcode = text.split(" ", 1)[0] if text else ""
    mma = _MMA_RE.fullmatch(opcode)
    if not mma or mma.group(1) != mma.group(2):
        return (f'static_assert(false, "xtrain emulator, line {line}: inline PTX \'{opcode}\' is not supported; '
                f'it runs {" and ".join(SUPPORTED_PTX)}");')
    groups = [re.findall(r"%(\d+)", g) for g in re.findall(r"\{([^}]*)\}", text)]
    if [len(g) for g in groups] != [4, 4, 2, 4] or any(int(i) >= len(operands) for g in groups for i in g):
        raise CompileError(f"line {line}: {opcode} takes {{d0..d3}}, {{a0..a3}}, {{b0, b1}}, {{c0..c3}} operands")
    d, a, b, c = ([operands[int(i)][1] for i in g] for g in groups)
    if any(operands[int(i)][0][:1] not in "=+" for i in groups[0]):
        raise CompileError(f"line {line}: the D operands of {opcode} must be outputs (\"=f\" or \"+f\")")
    kind = "xt::MMA_BF16" if mma.group(1) == "bf16" else "xt::MMA_F16"
    args = [f"({e})" for e in d] + [f"(unsigned)({e})" for e in a + b] + [f"(float)({e})" for e in c]
    return f"xt::mma_m16n8k16({line}, {kind}, {', '.join(args)});"


def rewrite_asm(src: str) -> str:
    """Replace each inline-PTX statement `asm volatile("mma.sync..." : outs : ins);` with the
    emulator's call of the same instruction (include/xtrain_mma.h), keeping the line count.
    Any other instruction becomes a static_assert naming it (a compile error if it is compiled)."""
    code = strip_comments(src)
    out, pos = [], 0
    for m in _ASM_RE.finditer(code):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        end = code.find(";", i)
        if depth or end < 0 or code[i:end].strip():
            continue  # not a complete asm statement: leave it to the compiler
        line = src.count("\n", 0, m.start()) + 1
        call = _asm_call(src, code, m.end(), i - 1, line)
        out.append(src[pos:m.start()] + call + "\n" * src.count("\n", m.start(), end + 1))
        pos = end + 1
    return "".join(out) + src[pos:]


_QUAL = r"(?:(?:volatile|static)\s+)*"
_SHARED_RE = re.compile(
    r"(?P<pre>" + _QUAL + r")(?P<ext>extern\s+" + _QUAL + r")?__shared__\s+"
    r"(?P<type>(?:[^;{}()=\[\]]|\([^()]*\))+?)\s*\b(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<dims>(?:\[[^\]]*\]\s*)*);"
)
_ALIGN_RE = re.compile(r"__align__\s*\([^)]*\)|alignas\s*\([^)]*\)|\bstatic\b")


def rewrite_shared(src: str, sanitize: bool = False) -> str:
    """Turn `__shared__` declarations into references into the block's shared arenas.

    `__shared__ float t[16][16];` becomes a reference to a slot of the static arena reserved
    once per declaration; `extern __shared__ float s[];` a pointer to the dynamic arena.
    Everything stays on one line so line numbers do not move. With `sanitize`, the names
    become checked views instead (xtrain_sanitizer.h)."""
    code = strip_comments(src)

    def repl(m: re.Match) -> str:
        if code[m.start()] != " " and code[: m.start()].count("{") == code[: m.start()].count("}"):
            line = src.count("\n", 0, m.start()) + 1
            raise CompileError(f"line {line}: __shared__ variables at file scope are not supported by the "
                               "CPU emulator; declare them inside the kernel")
        quals = " ".join(m.group(0)[: m.start("type") - m.start()].split())
        volatile = "volatile " if "volatile" in quals else ""
        typ = " ".join(_ALIGN_RE.sub(" ", m.group("type")).split())
        name, dims = m.group("name"), "".join(m.group("dims").split())
        if m.group("ext"):
            ptr = f"reinterpret_cast<{volatile}{typ}*>(xt_dynamic_shared())"
            if sanitize:
                info = f'static constexpr xt_sinfo xt_info_{name}{{"{name}", sizeof({typ}), 1, {{-1, 0, 0, 0}}}}; '
                return info + f"xt::sdyn<{volatile}{typ}> {name}{{{ptr}, &xt_info_{name}}};"
            return f"{volatile}{typ}* const {name} = {ptr};"
        t = f"xt_shared_t_{name}"
        decl = (f"using {t} = {volatile}{typ}{dims}; "
                f"static const xt_site_t xt_site_{name} = xt::new_site(sizeof({t}), alignof({t})); ")
        ref = f"*reinterpret_cast<{t}*>(xt_shared_site(&xt_site_{name}))"
        if sanitize:
            decl += f'static constexpr xt_sinfo xt_info_{name} = xt::sinfo<{t}>("{name}"); '
        if sanitize and dims:
            return decl + f"{t}& xt_ref_{name} = {ref}; " \
                          f"xt::sview<{t}> {name}{{xt_ref_{name}, &xt_ref_{name}, &xt_info_{name}}};"
        if sanitize:
            return decl + f"decltype(auto) {name} = xt::sscalar(&{ref}, &xt_info_{name});"
        return decl + f"{t}& {name} = {ref};"
    return _SHARED_RE.sub(repl, src)


def template_kernels(src: str) -> set[str]:
    """The kernels declared `template <...> __global__ ...`: launched by name expression only."""
    code = strip_comments(src)
    found = set()
    for m in _KERNEL_RE.finditer(code):
        before = code[: m.start()]
        cut = max(before.rfind(";"), before.rfind("}"), before.rfind("{"))
        if re.search(r"\btemplate\s*<", before[cut + 1:]):
            found.add(m.group(1))
    return found


_GLOBAL_VAR_RE = re.compile(r"\b(?:__constant__|__device__)\s+(?:(?:const|static|volatile)\s+)*[A-Za-z_][\w:]*"
                            r"(?:\s*<[^;{}()]*>)?[\s*&]+([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:=|;)")


def global_variables(src: str) -> list[str]:
    """File-scope `__constant__` / `__device__` variables (for get_global)."""
    code = strip_comments(src)
    return [m.group(1) for m in _GLOBAL_VAR_RE.finditer(code)
            if code[: m.start()].count("{") == code[: m.start()].count("}")]


def _symbol(expr: str) -> str:
    """A C identifier for a launch name: the kernel's own name, or a hash of a name expression."""
    return expr if re.fullmatch(r"[A-Za-z_]\w*", expr) else "e" + hashlib.sha256(expr.encode()).hexdigest()[:16]


def prepare_source(source: str, filename: str, sanitize: bool = False,
                   name_expressions=()) -> tuple[str, dict[str, str]]:
    """The C++ translation unit for `source`, and {launch name: symbol} of the kernels it launches.

    Non-template kernels are launched by name; template kernels only through the name
    expressions asked for, e.g. "scale<float, 128>" (as `cupy.RawModule(name_expressions=...)`)."""
    kernels, templates = list(find_kernels(source)), template_kernels(source)
    entries = {n: n for n in kernels if n not in templates}
    for expr in name_expressions:
        base = expr.split("<")[0].strip()
        if base not in kernels:
            raise CompileError(f"name expression {expr!r}: no __global__ function named {base!r} in {filename} "
                               f"(found: {', '.join(kernels) or 'none'})")
        entries[expr] = _symbol(expr)
    fname = filename.replace("\\", "/").replace('"', "")
    try:
        body = rewrite_shared(rewrite_asm(source), sanitize)
    except CompileError as e:
        raise CompileError(f"{fname}: {e}") from None
    lines = [f'#line 1 "{fname}"', body, "", '#line 1 "<xtrain kernel launchers>"']
    export = 'extern "C" __attribute__((visibility("default")))'
    for expr, sym in entries.items():
        lines.append(
            f"{export} int xt_launch_{sym}(const unsigned* g, const unsigned* b, unsigned long long shmem, "
            f"void** args, int mode, int workers, int fast, char* err, unsigned long long errlen) "
            f"{{ return xt::launch(&{expr}, g, b, shmem, args, mode, workers, fast, err, errlen); }}")
        lines.append(f"{export} const char* xt_signature_{sym}() {{ return xt::signature(&{expr}); }}")
    for var in global_variables(source):
        lines.append(f"{export} void* xt_global_{var}(unsigned long long* bytes) "
                     f"{{ *bytes = sizeof({var}); return (void*)&{var}; }}")
    return "\n".join(lines) + "\n", entries


# ------------------------------------------------------------------ compiling and caching
def cache_dir() -> Path:
    d = os.environ.get("XTRAIN_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "xtrain-lessons" / "kernels"


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise CompileError("no C++ compiler found: install g++ (or set $CXX) to run kernels on the CPU")
    return cxx


_version_cache: dict[str, str] = {}


def _compiler_version(cxx: str) -> str:
    if cxx not in _version_cache:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
        _version_cache[cxx] = out.stdout.splitlines()[0] if out.stdout else cxx
    return _version_cache[cxx]


def _headers_text() -> str:
    return "".join(p.read_text() for p in sorted(INCLUDE_DIR.glob("*.h")))


def _build(cpp: str, flags: tuple[str, ...], prefix: str, filename: str, link: tuple[str, ...] = (),
           source: str | None = None) -> Path:
    """Compile `cpp` into <cache>/<prefix><hash>.so unless it is there already.

    `source`: the text of a kernel given as a string; it is written beside the translation
    unit under `filename`, so that g++ can quote the offending line in its messages."""
    cxx = compiler()
    key = hashlib.sha256("\0".join([EMULATOR_VERSION, cpp, _headers_text(), " ".join(flags + link),
                                     _compiler_version(cxx)]).encode()).hexdigest()[:32]
    out_dir = cache_dir()
    lib = out_dir / f"{prefix}{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=out_dir))
    try:
        src = tmp / "kernel.cpp"
        src.write_text(cpp)
        if source is not None:
            (tmp / Path(filename).name).write_text(source)
        cmd = [cxx, *flags, "-x", "c++", str(src), "-x", "none", *link, "-o", str(tmp / "kernel.so")]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp if source is not None else None)
        if res.returncode != 0:
            msg = res.stderr.replace(str(tmp) + os.sep, "")
            raise CompileError(f"compiling {filename} for the CPU emulator failed:\n{msg.strip()}")
        os.replace(tmp / "kernel.cpp", out_dir / f"{prefix}{key}.cpp")  # kept for the curious
        os.replace(tmp / "kernel.so", lib)  # atomic: other processes see all or nothing
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lib


def build_host_library(cpp: str, flags: tuple[str, ...], prefix: str, filename: str) -> Path:
    """Compile plain C++ (no CUDA, no emulator runtime) with `flags` into a cached shared
    library; return its path. runtime/host's fused CPU kernels are built this way."""
    return _build(cpp, flags, prefix, filename)


def _tls_flags(cxx: str) -> tuple[str, ...]:
    """g++ on x86-64 Linux: TLS descriptors, which make threadIdx (thread-local in the runtime
    library, read by every kernel library) several times cheaper to reach than __tls_get_addr."""
    gcc = "clang" not in _compiler_version(cxx).lower()
    return ("-mtls-dialect=gnu2",) if gcc and platform.system() == "Linux" and platform.machine() == "x86_64" else ()


def runtime_library() -> Path:
    """The emulator runtime (scheduler, fibers, workers), compiled once per machine."""
    cpp = f'#include "{RUNTIME_HEADER}"\n'
    return _build(cpp, (*CXX_FLAGS, *_tls_flags(compiler()), "-I", str(INCLUDE_DIR)), "xtrain-runtime-",
                  RUNTIME_HEADER)


def compile_library(cpp: str, flags: tuple[str, ...] = (), filename: str = "kernel.cu",
                    source: str | None = None) -> Path:
    """Compile a prepared kernel translation unit into a shared library; return its cached path.

    The library links the runtime library by its full path, so loading it loads the runtime.
    A kernel read from a file may `#include "helper.cuh"` from its own folder; the included
    files' text is part of the cache key (one level deep)."""
    runtime = runtime_library()
    load_library(runtime)
    folder = Path(filename).parent if Path(filename).is_file() else None
    local = ()
    if folder is not None:
        local = ("-I", str(folder))
        cpp += f"// included: {hashlib.sha256(_local_includes(cpp, filename).encode()).hexdigest()}\n"
    base = (*CXX_FLAGS, *_tls_flags(compiler()), "-I", str(INCLUDE_DIR))
    compat = _precompiled_compat(base, flags) or COMPAT_HEADER
    return _build(cpp, (*base, *local, "-include", compat, *flags), "", filename, link=(str(runtime),), source=source)


_pch_failed: set = set()


def _precompiled_compat(base: tuple[str, ...], flags: tuple[str, ...]) -> str | None:
    """The compat header precompiled once per set of flags (g++ only), in the cache: the path to
    pass to -include, or None to include the header as it is.

    Parsing the header and the C++ library behind it is most of a small kernel's compile (0.4 of
    0.6 s); a precompiled header makes it 0.25 s, and a full test run compiles hundreds of kernels.
    Only with no -D / -U of the kernel's own (a macro could change the header); g++ falls back to
    the header itself when the .gch does not fit, so a bad .gch costs time, never correctness."""
    if "clang" in _compiler_version(compiler()).lower() or any(f != "-DXT_SANITIZE" for f in flags):
        return None
    cmd = [f for f in base if f != "-shared"] + list(flags)
    key = hashlib.sha256("\0".join([EMULATOR_VERSION, _headers_text(), " ".join(cmd),
                                     _compiler_version(compiler())]).encode()).hexdigest()[:24]
    folder = cache_dir() / f"pch-{key}"
    header = folder / COMPAT_HEADER
    if (folder / (COMPAT_HEADER + ".gch")).exists():
        return str(header)
    if key in _pch_failed:
        return None
    cache_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="pch-build-", dir=cache_dir()))
    try:
        shutil.copyfile(INCLUDE_DIR / COMPAT_HEADER, tmp / COMPAT_HEADER)
        res = subprocess.run([compiler(), *cmd, "-x", "c++-header", str(tmp / COMPAT_HEADER),
                              "-o", str(tmp / (COMPAT_HEADER + ".gch"))], capture_output=True, text=True)
        if res.returncode != 0:
            _pch_failed.add(key)
            return None
        try:
            os.rename(tmp, folder)  # atomic; another process may have won the race
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(header) if (folder / (COMPAT_HEADER + ".gch")).exists() else None


# ------------------------------------------------------------------ argument types
_CTYPE_NAMES = {"f4": "float", "f8": "double", "i1": "signed char", "u1": "unsigned char", "i2": "short",
                "u2": "unsigned short", "i4": "int", "u4": "unsigned int", "i8": "long long",
                "u8": "unsigned long long", "b1": "bool", "bf16": "__nv_bfloat16", "v": "void"}
_DTYPES = {"f4": np.float32, "f8": np.float64, "i1": np.int8, "u1": np.uint8, "i2": np.int16, "u2": np.uint16,
           "i4": np.int32, "u4": np.uint32, "i8": np.int64, "u8": np.uint64, "b1": np.bool_}


def _bf16_dtypes() -> tuple:
    try:
        return (np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16))
    except ImportError:
        return (np.dtype(np.uint16),)


class Param:
    """One kernel parameter, parsed from the type code exported by the compiled library."""
    def __init__(self, index: int, code: str):
        self.index, self.code = index, code
        self.pointer = "*" in code
        self.const = code.startswith("c*")
        self.base = code.split("*")[-1]
        if self.base.startswith("?"):
            self.ctype, self.size = f"<{self.base[1:]}-byte struct>", int(self.base[1:])
        else:
            self.ctype = _CTYPE_NAMES[self.base]
            self.size = 2 if self.base == "bf16" else np.dtype(_DTYPES.get(self.base, np.void)).itemsize

    @property
    def c_decl(self) -> str:
        return ("const " if self.const else "") + self.ctype + ("*" if self.pointer else "")

    def dtypes(self) -> tuple:
        if self.base == "bf16":
            return _bf16_dtypes()
        return (np.dtype(_DTYPES[self.base]),) if self.base in _DTYPES else ()

    def _where(self) -> str:
        return f"argument {self.index} ({self.c_decl})"

    def pack(self, value, slots: np.ndarray, keep: list) -> None:
        """Store the argument's bytes in slots[index] (a uint64); raise if it does not fit."""
        i = self.index
        if self.pointer:
            if not isinstance(value, np.ndarray):
                kind = "a CuPy array: the CPU emulator needs NumPy arrays (use to_host)" \
                    if type(value).__module__.startswith("cupy") else f"{type(value).__name__}"
                raise TypeError(f"{self._where()}: expected a NumPy array, got {kind}")
            ok = self.dtypes()
            if ok and value.dtype not in ok:
                want = " or ".join(str(d) for d in ok)
                raise TypeError(f"{self._where()}: expected a {want} array, got {value.dtype}")
            if not value.flags.c_contiguous:
                raise ValueError(f"{self._where()}: the array is not C-contiguous; pass np.ascontiguousarray(a)")
            if not self.const and not value.flags.writeable:
                raise ValueError(f"{self._where()}: the array is read-only but the kernel may write to it")
            slots[i] = value.ctypes.data
            keep.append(value)
            return
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            hint = {"f4": "np.float32", "f8": "np.float64", "i4": "np.int32", "u4": "np.uint32",
                    "i8": "np.int64", "u8": "np.uint64", "b1": "np.bool_"}.get(self.base, "a NumPy scalar")
            raise TypeError(f"{self._where()}: got a Python {type(value).__name__}; pass {hint}(...) — "
                            "CuPy passes Python ints and floats as 64-bit values, so the type must be explicit")
        ok = self.dtypes()
        if self.base.startswith("?"):
            if not (isinstance(value, np.generic) and value.dtype.itemsize == self.size):
                raise TypeError(f"{self._where()}: expected a NumPy structured scalar of {self.size} bytes")
        elif not isinstance(value, np.generic) or value.dtype not in ok:
            got = value.dtype if isinstance(value, np.generic) else type(value).__name__
            raise TypeError(f"{self._where()}: expected {ok[0].name if ok else self.ctype}, got {got}")
        raw = np.frombuffer(value.tobytes(), np.uint8)
        slots[i : i + 1].view(np.uint8)[: raw.size] = raw


def _dim3(v, what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or any(int(x) < 1 for x in t):
        raise ValueError(f"{what} must be a positive int or a tuple of 1-3 positive ints, got {v!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


def check_launch(grid, block, shared_mem) -> tuple[tuple, tuple, int]:
    """Normalise grid/block to 3-tuples and apply CUDA's limits."""
    g, b = _dim3(grid, "grid"), _dim3(block, "block")
    if b[0] * b[1] * b[2] > 1024 or b[2] > 64:
        raise ValueError(f"block {b} has more than 1024 threads (or z > 64): CUDA cannot launch it")
    if g[1] > 65535 or g[2] > 65535:
        raise ValueError(f"grid {g}: y and z must be at most 65535")
    if int(shared_mem) < 0:
        raise ValueError("shared_mem must be >= 0")
    return g, b, int(shared_mem)


# ------------------------------------------------------------------ loading and launching
_libs: dict[Path, ctypes.CDLL] = {}
_lock = threading.Lock()


def load_library(path: Path) -> ctypes.CDLL:
    with _lock:
        if path not in _libs:
            _libs[path] = ctypes.CDLL(str(path))
        return _libs[path]


def _cpu_flags(options) -> tuple[str, ...]:
    """Of the (NVRTC-style) options, the ones that mean the same to g++: -D, -U, -I."""
    return tuple(o for o in options if o.startswith(("-D", "-U", "-I")))


def emulator_mode() -> str:
    mode = os.environ.get("XTRAIN_EMULATOR_MODE", "fibers")
    if mode not in MODES:
        raise ValueError(f"XTRAIN_EMULATOR_MODE={mode!r}: choose one of {', '.join(MODES)}")
    return mode


_CPUS = os.cpu_count() or 1


def emulator_workers() -> int:
    """How many OS threads run blocks: $XTRAIN_EMULATOR_WORKERS, else one per core."""
    return int(os.environ.get("XTRAIN_EMULATOR_WORKERS", 0)) or _CPUS


def _with_c_stdout_to_python(fn):
    """Run fn() with the C stdout (a kernel's printf) copied to Python's sys.stdout afterwards,
    so that kernel output shows in Jupyter, which only sees Python's stdout."""
    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            result = fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    if text:
        sys.stdout.write(text)
    return result


def _local_includes(source: str, filename: str) -> str:
    """The text of the files a kernel file includes from its own folder (one level deep)."""
    folder = Path(filename).parent if Path(filename).is_file() else None
    if folder is None:
        return ""
    found = [folder / inc for inc in re.findall(r'#\s*include\s*"([^"]+)"', source)]
    return "".join(p.read_text() for p in found if p.is_file())


_guarded_lock = threading.Lock()


def sanitize_default() -> bool:
    """$XTRAIN_SANITIZE=1 turns the sanitizer on for every kernel compiled afterwards."""
    return os.environ.get("XTRAIN_SANITIZE", "0").strip().lower() in ("1", "true", "yes", "on")


class CpuModule:
    """A CUDA source compiled for the CPU emulator, like `cupy.RawModule`: its kernels by name
    (or name expression, for templates) and its `__constant__` / `__device__` variables."""

    backend = "cpu"

    def __init__(self, source: str, options=(), filename: str | None = None, sanitize: bool | None = None,
                 name_expressions=()):
        self.source, self.filename = source, filename or "module.cu"
        self.sanitize = sanitize_default() if sanitize is None else bool(sanitize)
        self.name_expressions = tuple(name_expressions)
        cpp, self.entries = prepare_source(source, self.filename, self.sanitize, self.name_expressions)
        from_file = filename is not None and Path(filename).is_file()
        flags = _cpu_flags(options) + (("-DXT_SANITIZE",) if self.sanitize else ())
        self.library_path = compile_library(cpp, flags, self.filename, source=None if from_file else source)
        self.lib = load_library(self.library_path)
        self.globals = global_variables(source)

    def get_function(self, name: str) -> "CpuKernel":
        return CpuKernel(self.source, name, filename=self.filename, module=self)

    def get_global(self, name: str) -> "GlobalMemory":
        if name not in self.globals:
            raise KeyError(f"no __constant__ or __device__ variable {name!r} at file scope in {self.filename} "
                           f"(found: {', '.join(self.globals) or 'none'})")
        fn = getattr(self.lib, f"xt_global_{name}")
        fn.restype = ctypes.c_void_p
        size = ctypes.c_ulonglong(0)
        ptr = fn(ctypes.byref(size))
        return GlobalMemory(ptr, size.value, name)


class GlobalMemory:
    """A `__constant__` / `__device__` variable's memory, with CuPy's MemoryPointer copy methods."""
    def __init__(self, ptr: int, size: int, name: str):
        self.ptr, self.size, self.name = ptr, size, name

    def copy_from_host(self, src, size: int) -> None:
        if size > self.size:
            raise ValueError(f"{self.name} holds {self.size} bytes; cannot copy {size} into it")
        ctypes.memmove(self.ptr, src, size)

    def copy_to_host(self, dst, size: int) -> None:
        ctypes.memmove(dst, self.ptr, min(size, self.size))


class CpuKernel:
    """A kernel compiled for the CPU emulator; call it like `cupy.RawKernel`."""
    backend = "cpu"

    def __init__(self, source: str, name: str, options=(), filename: str | None = None,
                 sanitize: bool | None = None, module: CpuModule | None = None):
        if module is None:
            module = CpuModule(source, options, filename or f"{name.split('<')[0].strip()}.cu", sanitize,
                               name_expressions=(name,) if "<" in name else ())
        self.name, self.source, self.filename, self.sanitize = name, source, module.filename, module.sanitize
        if name not in module.entries:
            found = ", ".join(module.entries) or "none"
            hint = " (a template kernel: pass its name expression, e.g. \"kernel<float, 128>\")" \
                if name in template_kernels(source) else ""
            raise CompileError(f"no __global__ function named {name!r} in {self.filename} (found: {found}){hint}")
        self.library_path, lib, sym = module.library_path, module.lib, module.entries[name]
        sig = getattr(lib, f"xt_signature_{sym}")
        sig.restype = ctypes.c_char_p
        codes = sig().decode()
        self.params = [Param(i, c) for i, c in enumerate(codes.split(",") if codes else [])]
        self._launch = getattr(lib, f"xt_launch_{sym}")
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_ulonglong]
        base = name.split("<")[0].strip()
        self.uses_barriers = needs_fibers(source, base, _local_includes(source, self.filename))
        self.uses_printf = "printf" in strip_comments(source)
        self.param_names = param_names(source, base)

    @property
    def signature(self) -> str:
        """The C parameter list, e.g. 'const float*, const float*, float*, int'."""
        return ", ".join(p.c_decl for p in self.params)

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        g, b, shmem = check_launch(grid, block, shared_mem)
        args = tuple(args)
        if len(args) != len(self.params):
            raise TypeError(f"kernel {self.name}({self.signature}) takes {len(self.params)} arguments, "
                            f"got {len(args)}")
        slots = np.zeros(max(len(args), 1), np.uint64)
        keep: list = []
        for p, a in zip(self.params, args):
            p.pack(a, slots, keep)
        ptrs = slots.ctypes.data + 8 * np.arange(len(slots), dtype=np.uint64)
        err = ctypes.create_string_buffer(4096)
        dims = (ctypes.c_uint * 6)(*g, *b)
        flags = 2 if self.sanitize else (0 if self.uses_barriers else 1)
        workers = 1 if self.sanitize else emulator_workers()  # one worker: the first bug in block order

        def launch() -> int:
            return self._launch(ctypes.addressof(dims), ctypes.addressof(dims) + 12, shmem, ptrs.ctypes.data,
                                MODES[emulator_mode()], workers, flags, err, len(err))
        run = (lambda: _with_c_stdout_to_python(launch)) if self.uses_printf else launch
        rc = self._run_guarded(run, args, slots) if self.sanitize else run()
        if rc != 0:
            raise KernelError(f"kernel {self.name} ({self.filename}): {err.value.decode(errors='replace')}")

    def _run_guarded(self, run, args, slots: np.ndarray) -> int:
        """Sanitizer mode: run with every array copied into a region that ends at guard pages."""
        with _guarded_lock:  # the runtime keeps one set of regions: one sanitized launch at a time
            return self._run_guarded_locked(run, args, slots)

    def _run_guarded_locked(self, run, args, slots: np.ndarray) -> int:
        rt = load_library(runtime_library())
        rt.xt_san_region.restype = ctypes.c_void_p
        rt.xt_san_region.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_char_p]
        arrays = [(p, a) for p, a in zip(self.params, args) if p.pointer]
        spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for _, a in arrays]
        copies: dict = {}  # span -> (array, copy): an array passed twice shares one copy, as it shares memory
        try:
            for (p, a), span in zip(arrays, spans):
                if span in copies:
                    slots[p.index] = copies[span][1]
                    continue
                if any(s != span and s[0] < span[1] and span[0] < s[1] for s in spans):
                    continue  # partly overlaps another argument: passed as it is, unchecked
                name = self.param_names[p.index] if p.index < len(self.param_names) else f"arg{p.index}"
                buf = rt.xt_san_region(a.nbytes, a.itemsize, name.encode(), p.c_decl.encode())
                if not buf:
                    raise MemoryError(f"sanitizer: could not map a guarded copy of {name}")
                ctypes.memmove(buf, a.ctypes.data, a.nbytes)
                slots[p.index] = buf
                copies[span] = (a, buf)
            return run()
        finally:
            written = {span for (p, _), span in zip(arrays, spans) if not p.const}
            for span, (a, buf) in copies.items():
                if span in written:
                    ctypes.memmove(a.ctypes.data, buf, a.nbytes)
            rt.xt_san_release()

    def __repr__(self) -> str:
        return f"CpuKernel({self.name}({self.signature}), {self.filename})"


def mma_fragment_layout(operand: str) -> tuple[np.ndarray, np.ndarray]:
    """Where each lane's registers sit in the matrices of `mma.sync.m16n8k16`, as the emulator
    implements it (include/xtrain_mma.h, read from the runtime library): operand "a" (16x16,
    8 elements a lane), "b" (16x8, 4) or "c" (C and D, 16x8, 4). Returns (rows, cols), each
    (32, n) int arrays: element i of lane l sits at (rows[l, i], cols[l, i])."""
    index = {"a": 0, "b": 1, "c": 2, "d": 2}.get(str(operand).lower())
    if index is None:
        raise ValueError(f"operand must be 'a', 'b' or 'c', got {operand!r}")
    n = 8 if index == 0 else 4
    rows, cols = np.zeros((32, n), np.int32), np.zeros((32, n), np.int32)
    fn = load_library(runtime_library()).xt_mma_layout
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    fn(index, rows.ctypes.data, cols.ctypes.data)
    return rows, cols
