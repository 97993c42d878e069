"""Plausible wrong solutions of T11's exercises (format: tests/test_mutants.py)."""

_SIZE = """
n = max(int(nbytes), int(min_bytes), 1)
p = 1 << (n - 1).bit_length()
if p <= 1 << 20:
    return p
step = p // 8
return -(-n // step) * step
"""
_FREE = """
free_lists = {}

def get(cls):
    free = free_lists.get(cls)
    if free:
        stats["hits"] += 1
        return free.pop()
    stats["misses"] += 1
    return np.empty(cls, dtype=np.uint8)

def put(cls, buf):
    free_lists.setdefault(cls, []).append(buf)

return get, put
"""
_ALLOC = """
def alloc(shape, dtype):
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    cls = size_class(nbytes)
    buf = get(cls)
    arr = buf[:nbytes].view(dtype).reshape(shape)
    live[id(arr)] = (arr, buf, cls)
    stats["in_use"] += cls
    return arr

def free(arr):
    entry = live.get(id(arr))
    if entry is None or entry[0] is not arr:
        raise ValueError("free: not an array this allocator handed out (a view, or freed twice)")
    del live[id(arr)]
    _, buf, cls = entry
    stats["in_use"] -= cls
    put(cls, buf)

return alloc, free
"""

MUTANTS = {
    "T11.1": {
        "power of two above n, not at least n (n.bit_length())": _SIZE.replace("(n - 1).bit_length()", "n.bit_length()"),
        "min_bytes ignored": _SIZE.replace("max(int(nbytes), int(min_bytes), 1)", "max(int(nbytes), 1)"),
        "large sizes rounded to a quarter, not an eighth": _SIZE.replace("p // 8", "p // 4"),
        "large sizes rounded down": _SIZE.replace("-(-n // step) * step", "n // step * step"),
    },
    "T11.2": {
        "hits and misses not counted": _FREE.replace('        stats["hits"] += 1\n', "").replace('    stats["misses"] += 1\n', ""),
        "buffer handed out but left in the free list": _FREE.replace("return free.pop()", "return free[-1]"),
        "one free list for all classes": _FREE.replace("free_lists.get(cls)", "free_lists.get(0)").replace(
            "free_lists.setdefault(cls, [])", "free_lists.setdefault(0, [])"),
        "a put buffer never reused (new buffer every time)": _FREE.replace("    if free:\n", "    if False:\n"),
    },
    "T11.3": {
        "bytes counted as elements (itemsize forgotten)": _ALLOC.replace(" * np.dtype(dtype).itemsize", ""),
        "the view put back instead of the raw buffer": _ALLOC.replace("    put(cls, buf)", "    put(cls, arr)"),
        "the buffer found through arr.base (a view frees the whole buffer)": """
            def alloc(shape, dtype):
                nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                cls = size_class(nbytes)
                buf = get(cls)
                stats["in_use"] += cls
                return buf[:nbytes].view(dtype).reshape(shape)

            def free(arr):
                buf = arr.base
                stats["in_use"] -= buf.nbytes
                put(buf.nbytes, buf)

            return alloc, free
        """,
        "double free not detected (the entry never removed)": _ALLOC.replace("    del live[id(arr)]\n", ""),
        "in_use not decreased by free": _ALLOC.replace('    stats["in_use"] -= cls\n', ""),
        "the class of the request's element count": _ALLOC.replace("cls = size_class(nbytes)",
                                                                   "cls = size_class(int(np.prod(shape, dtype=np.int64)))"),
    },
}
