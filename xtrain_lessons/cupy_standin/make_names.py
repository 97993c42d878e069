"""Write cupy_names.json from a real CuPy (pip install cupy-cuda12x: it imports without a GPU).

    python xtrain_lessons/cupy_standin/make_names.py   # then commit its cupy_names.json
"""

import json
from pathlib import Path

DUNDERS = ("__array_ufunc__", "__array_function__", "__array__", "__dlpack__", "__cuda_array_interface__")


def public(obj) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_") or n in DUNDERS)


def main():
    import cupy  # noqa: PLC0415 (a developer's tool: the package itself never needs CuPy)
    import cupy.cuda.runtime  # noqa: PLC0415

    names = {
        "cupy_version": cupy.__version__,
        "cupy": public(cupy),
        "cupy.ndarray": sorted(dir(cupy.ndarray)),
        "cupy.ufunc": public(cupy.add),
        "cupy.cuda": public(cupy.cuda),
        "cupy.cuda.runtime": public(cupy.cuda.runtime),
        "cupy.cuda.Device": public(cupy.cuda.Device),
        "cupy.cuda.Stream": public(cupy.cuda.Stream),
        "cupy.cuda.MemoryPool": public(cupy.cuda.MemoryPool),
        "cupy.RawKernel": public(cupy.RawKernel),
        "cupy.RawModule": public(cupy.RawModule),
    }
    out = Path(__file__).with_name("cupy_names.json")
    out.write_text(json.dumps(names, indent=0) + "\n")
    print(f"wrote {out} (CuPy {cupy.__version__})")


if __name__ == "__main__":
    main()
