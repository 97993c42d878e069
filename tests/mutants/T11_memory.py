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
}
