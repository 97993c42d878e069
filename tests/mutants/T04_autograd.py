"""Plausible wrong solutions of T04's exercises (format: tests/test_mutants.py)."""

_SOFTMAX_FWD = """
e = np.exp(x.data - x.data.max(axis=-1, keepdims=True))
y = e / e.sum(axis=-1, keepdims=True)
"""
_CE = """
z = logits.data
m = z.max(axis=1, keepdims=True)
e = np.exp(z - m)
s = e.sum(axis=1, keepdims=True)
rows = np.arange(len(targets))
loss = np.mean(np.log(s[:, 0]) + m[:, 0] - z[rows, targets])
def backward(g):
    dz = e / s
    dz[rows, targets] -= 1
    return (dz * (g / len(targets)),)
return make_node(np.asarray(loss), (logits,), backward, "cross_entropy")
"""
_NUMGRAD = """
grad = np.zeros_like(x)
for i in np.ndindex(x.shape):
    old = x[i]
    x[i] = old + eps
    f_plus = f(x)
    x[i] = old - eps
    f_minus = f(x)
    x[i] = old
    grad[i] = (f_plus - f_minus) / (2 * eps)
return grad
"""
_BACKWARD = """
grads, leaves = {id(root): np.ones_like(root.data)}, {}
for t in reversed(topological_order(root)):
    g = grads.pop(id(t))
    if t._backward is None:
        leaves[id(t)] = g
        continue
    for p, gp in zip(t._parents, t._backward(g)):
        if gp is None or not p.requires_grad:
            continue
        if t._unbroadcast:
            gp = unbroadcast(gp, p.shape)
        grads[id(p)] = grads[id(p)] + gp if id(p) in grads else gp
return leaves
"""
_TOPO = """
order, seen, stack = [], set(), [(root, False)]
while stack:
    t, parents_done = stack.pop()
    if parents_done:
        order.append(t)
        continue
    if id(t) in seen:
        continue
    seen.add(id(t))
    stack.append((t, True))
    stack.extend((p, False) for p in t._parents if p.requires_grad)
return order
"""

MUTANTS = {
    "T04.1": {
        "only the leading axes summed (size-1 axes kept stretched)": """
            while g.ndim > len(shape):
                g = g.sum(axis=0)
            return g
        """,
        "size-1 axes summed without keepdims": """
            shape = tuple(shape)
            while g.ndim > len(shape):
                g = g.sum(axis=0)
            for i, n in enumerate(shape):
                if n == 1 and g.shape[i] != 1:
                    g = g.sum(axis=i)
            return g
        """,
        "leading axes summed from the wrong end (axis=-1)": """
            shape = tuple(shape)
            while g.ndim > len(shape):
                g = g.sum(axis=-1)
            for i, n in enumerate(shape):
                if n == 1 and g.shape[i] != 1:
                    g = g.sum(axis=i, keepdims=True)
            return g
        """,
        "mean instead of sum": """
            shape = tuple(shape)
            while g.ndim > len(shape):
                g = g.mean(axis=0)
            for i, n in enumerate(shape):
                if n == 1 and g.shape[i] != 1:
                    g = g.mean(axis=i, keepdims=True)
            return g
        """,
    },
    "T04.2": {
        "gradients not unbroadcast": """
            def backward(g):
                return g * b.data, g * a.data
            return make_node(a.data * b.data, (a, b), backward, "mul")
        """,
        "each input gets its own value as gradient": """
            def backward(g):
                return unbroadcast(g * a.data, a.shape), unbroadcast(g * b.data, b.shape)
            return make_node(a.data * b.data, (a, b), backward, "mul")
        """,
        "upstream gradient g dropped": """
            def backward(g):
                return unbroadcast(b.data + 0 * g, a.shape), unbroadcast(a.data + 0 * g, b.shape)
            return make_node(a.data * b.data, (a, b), backward, "mul")
        """,
    },
    "T04.3": {
        "recursive depth-first search (recursion limit on a deep chain)": """
            order, seen = [], set()
            def visit(t):
                if id(t) in seen:
                    return
                seen.add(id(t))
                for p in t._parents:
                    if p.requires_grad:
                        visit(p)
                order.append(t)
            visit(root)
            return order
        """,
        "no 'seen' set (shared tensors appear twice)": _TOPO.replace("    if id(t) in seen:\n        continue\n", ""),
        # issue 37: marks parents as seen when it pushes them, from a list built before marking:
        # x twice for (x * x).sum(), and in a diamond an op before its parent
        "parents marked seen when pushed (x twice for x * x, an op before its parent)": ("""
            order, seen, stack = [], {id(root)}, [root]
            while stack:
                t = stack[-1]
                todo = [p for p in t._parents if p.requires_grad and id(p) not in seen]
                if todo:
                    for p in todo:
                        seen.add(id(p))
                    stack.extend(todo)
                else:
                    order.append(stack.pop())
            return order
        """, "one op uses x twice"),
        "appended on first visit (children before parents)": """
            order, seen, stack = [], set(), [root]
            while stack:
                t = stack.pop()
                if id(t) in seen:
                    continue
                seen.add(id(t))
                order.append(t)
                stack.extend(p for p in t._parents if p.requires_grad)
            return order
        """,
    },
    "T04.4": {
        "fan-out gradients overwritten, not summed": _BACKWARD.replace(
            "grads[id(p)] + gp if id(p) in grads else gp", "gp"),
        "walks parents before children (order not reversed)": _BACKWARD.replace(
            "reversed(topological_order(root))", "topological_order(root)").replace(
            "g = grads.pop(id(t))", "g = grads.pop(id(t), np.zeros_like(t.data))"),
        # breadth-first from the loss: a tensor may pass its gradient on before every use has sent its part
        "breadth-first from the loss instead of the reversed order": ("""
            grads, leaves, queue, queued = {id(root): np.ones_like(root.data)}, {}, [root], {id(root)}
            while queue:
                t = queue.pop(0)
                g = grads.pop(id(t))
                if t._backward is None:
                    leaves[id(t)] = g
                    continue
                for p, gp in zip(t._parents, t._backward(g)):
                    if gp is None or not p.requires_grad:
                        continue
                    if t._unbroadcast:
                        gp = unbroadcast(gp, p.shape)
                    grads[id(p)] = grads[id(p)] + gp if id(p) in grads else gp
                    if id(p) not in queued:
                        queued.add(id(p))
                        queue.append(p)
            return leaves
        """, "d loss / d x"),
        "the child's gradient passed on unchanged (no local backward)": _BACKWARD.replace(
            "zip(t._parents, t._backward(g))", "((p, g) for p in t._parents)").replace(
            "    if t._unbroadcast:\n", "    if True:\n"),
    },
    "T04.5": {
        "da without the transpose of b (g @ b)": """
            def backward(g):
                return g @ b.data, a.data.T @ g
            return make_node(a.data @ b.data, (a, b), backward, "matmul")
        """,
        "da and db swapped": """
            def backward(g):
                return a.data.T @ g, g @ b.data.T
            return make_node(a.data @ b.data, (a, b), backward, "matmul")
        """,
        "db as g.T @ a (transposed)": """
            def backward(g):
                return g @ b.data.T, g.T @ a.data
            return make_node(a.data @ b.data, (a, b), backward, "matmul")
        """,
    },
    "T04.6": {
        "no max subtracted (overflows for large logits)": ("""
            e = np.exp(x.data)
            y = e / e.sum(axis=-1, keepdims=True)
            def backward(g):
                return (y * (g - (g * y).sum(axis=-1, keepdims=True)),)
            return make_node(y, (x,), backward, "softmax")
        """, "logits ~1000"),
        "the maximum of the whole array, not of each row": (_SOFTMAX_FWD.replace(
            "x.data.max(axis=-1, keepdims=True)", "x.data.max()") + """
            def backward(g):
                return (y * (g - (g * y).sum(axis=-1, keepdims=True)),)
            return make_node(y, (x,), backward, "softmax")
        """.replace("            ", ""), "all-negative rows"),
        "the row maximum clipped at 0": (_SOFTMAX_FWD.replace(
            "x.data.max(axis=-1, keepdims=True)", "np.maximum(x.data.max(axis=-1, keepdims=True), 0)") + """
            def backward(g):
                return (y * (g - (g * y).sum(axis=-1, keepdims=True)),)
            return make_node(y, (x,), backward, "softmax")
        """.replace("            ", ""), "all-negative rows"),
        "backward without the row sum (y * g)": _SOFTMAX_FWD + """
            def backward(g):
                return (y * g,)
            return make_node(y, (x,), backward, "softmax")
        """.replace("            ", ""),
        "softmax over the first axis": _SOFTMAX_FWD.replace("axis=-1", "axis=0") + """
            def backward(g):
                return (y * (g - (g * y).sum(axis=0, keepdims=True)),)
            return make_node(y, (x,), backward, "softmax")
        """.replace("            ", ""),
        "row sum without keepdims (broadcast on the wrong axis)": _SOFTMAX_FWD + """
            def backward(g):
                return (y * (g - (g * y).sum(axis=-1)),)
            return make_node(y, (x,), backward, "softmax")
        """.replace("            ", ""),
    },
    "T04.7": {
        "no max subtracted (overflows)": (_CE.replace("m = z.max(axis=1, keepdims=True)", "m = np.zeros((len(z), 1))"),
                                          "logits ~1000"),
        "the maximum of the whole batch, not of each row": (_CE.replace(
            "m = z.max(axis=1, keepdims=True)", "m = np.full((len(z), 1), z.max())"), "all-negative rows"),
        "the row maximum clipped at 0": (_CE.replace(
            "m = z.max(axis=1, keepdims=True)", "m = np.maximum(z.max(axis=1, keepdims=True), 0)"), "all-negative rows"),
        "gradient not divided by N": _CE.replace("(g / len(targets))", "g"),
        "one-hot not subtracted in the backward": _CE.replace("    dz[rows, targets] -= 1\n", ""),
        "loss summed, not averaged": _CE.replace("loss = np.mean(", "loss = np.sum("),
    },
    "T04.8": {
        "one-sided difference": _NUMGRAD.replace("x[i] = old - eps\n    f_minus = f(x)", "x[i] = old\n    f_minus = f(x)").replace("(2 * eps)", "eps"),
        "central difference without the 2": _NUMGRAD.replace("(2 * eps)", "eps"),
        "x not restored after each element": (_NUMGRAD.replace("    x[i] = old\n    grad", "    grad"), "put each element back"),
    },
}
