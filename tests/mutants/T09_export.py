"""Plausible wrong solutions of T09's exercises (format: tests/test_mutants.py)."""

_CONFIG = """
return {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": c.vocab_size,
    "hidden_size": c.dim,
    "intermediate_size": c.ffn_dim,
    "num_hidden_layers": c.n_layers,
    "num_attention_heads": c.n_heads,
    "num_key_value_heads": c.n_kv_heads,
    "head_dim": c.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": c.max_seq_len,
    "rms_norm_eps": c.norm_eps,
    "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
    "rope_theta": c.rope_theta,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
"""

MUTANTS = {
    "T09.1": {
        "normalised over the heads axis": """
            ms = np.mean(x * x, axis=2, keepdims=True)
            return x / np.sqrt(ms + eps) * weight
        """,
        "eps outside the square root": """
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / (np.sqrt(ms) + eps) * weight
        """,
        "one mean square per position (heads flattened together)": """
            B, T, H, D = x.shape
            ms = np.mean((x * x).reshape(B, T, H * D), axis=-1)[..., None, None]
            return x / np.sqrt(ms + eps) * weight
        """,
        "weight forgotten": """
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / np.sqrt(ms + eps)
        """,
    },
    "T09.2": {
        "head_dim left out (transformers derives dim / heads)": _CONFIG.replace('    "head_dim": c.head_dim,\n', ""),
        "kv heads set to the query heads": _CONFIG.replace('"num_key_value_heads": c.n_kv_heads', '"num_key_value_heads": c.n_heads'),
        "tied embeddings": _CONFIG.replace('"tie_word_embeddings": False', '"tie_word_embeddings": True'),
        "intermediate_size from 4 * dim": _CONFIG.replace('"intermediate_size": c.ffn_dim', '"intermediate_size": 4 * c.dim'),
    },
}

_NAMES = """
names = ["model.embed_tokens.weight"]
for i in range(c.n_layers):
    p = f"model.layers.{i}."
    names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names += [p + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
    names += [p + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
return names + ["model.norm.weight", "lm_head.weight"]
"""
_READ = """
raw = Path(path).read_bytes()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
out = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    start, stop = info["data_offsets"]
    if info["dtype"] == "F32":
        a = np.frombuffer(data[start:stop], dtype="<f4").astype(np.float32)
    elif info["dtype"] == "BF16":
        a = (np.frombuffer(data[start:stop], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(f"{name}: dtype {info['dtype']} is not F32 or BF16")
    out[name] = a.reshape(info["shape"])
return out
"""

MUTANTS["T09.3"] = {
    "QK-norm gains left out (a Llama-style layer)": _NAMES.replace(', "q_norm", "k_norm"', ""),
    "layers numbered from 1": _NAMES.replace("range(c.n_layers)", "range(1, c.n_layers + 1)"),
    "the final norm without the model. prefix": _NAMES.replace('"model.norm.weight"', '"norm.weight"'),
    "lm_head left out (as if tied)": _NAMES.replace(', "lm_head.weight"]', "]"),
}
MUTANTS["T09.4"] = {
    "offsets counted from the start of the file": _READ.replace("data = raw[8 + n:]", "data = raw"),
    "big-endian floats": _READ.replace('dtype="<f4"', 'dtype=">f4"').replace('dtype="<u2"', 'dtype=">u2"'),
    "bf16 bits in the lower half of the float32 (no shift)": _READ.replace(".astype(np.uint32) << 16)", ".astype(np.uint32))"),
    "bf16 read as float16": _READ.replace('(np.frombuffer(data[start:stop], dtype="<u2").astype(np.uint32) << 16).view(np.float32)',
                                          'np.frombuffer(data[start:stop], dtype="<f2").astype(np.float32)'),
    "shape ignored (flat arrays)": _READ.replace('out[name] = a.reshape(info["shape"])', "out[name] = a"),
    "the metadata entry read as a tensor": _READ.replace('    if name == "__metadata__":\n        continue\n', ""),
}

