"""Plausible wrong solutions of the T20_sft exercises, each of which its check must reject.

A mutant is the text that replaces the solution region (tests/test_mutants.py runs it through
the notebook's own check cell), or (text, words the fail line must contain).
"""

MUTANTS = {
    "T20.1": {
        "prompt left in the mask": """
            seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
            T = max(len(s) for s in seqs) - 1
            input_ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
            labels = np.full((len(seqs), T), pad_id, dtype=np.int64)
            mask = np.zeros((len(seqs), T), dtype=np.float32)
            for b, (p, r) in enumerate(zip(prompts, responses)):
                s = seqs[b]
                input_ids[b, :len(s) - 1] = s[:-1]
                labels[b, :len(s) - 1] = s[1:]
                mask[b, :len(p) - 1 + len(r)] = 1.0
            return input_ids, labels, mask
        """,
        "padding left in the mask": ("""
            seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
            T = max(len(s) for s in seqs) - 1
            input_ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
            labels = np.full((len(seqs), T), pad_id, dtype=np.int64)
            mask = np.zeros((len(seqs), T), dtype=np.float32)
            for b, (p, r) in enumerate(zip(prompts, responses)):
                s = seqs[b]
                input_ids[b, :len(s) - 1] = s[:-1]
                labels[b, :len(s) - 1] = s[1:]
                mask[b, len(p) - 1:] = 1.0
            return input_ids, labels, mask
        """, "padding"),
        "mask one position late": """
            seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
            T = max(len(s) for s in seqs) - 1
            input_ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
            labels = np.full((len(seqs), T), pad_id, dtype=np.int64)
            mask = np.zeros((len(seqs), T), dtype=np.float32)
            for b, (p, r) in enumerate(zip(prompts, responses)):
                s = seqs[b]
                input_ids[b, :len(s) - 1] = s[:-1]
                labels[b, :len(s) - 1] = s[1:]
                mask[b, len(p):len(p) + len(r)] = 1.0
            return input_ids, labels, mask
        """,
        "labels not shifted": """
            seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
            T = max(len(s) for s in seqs) - 1
            input_ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
            labels = np.full((len(seqs), T), pad_id, dtype=np.int64)
            mask = np.zeros((len(seqs), T), dtype=np.float32)
            for b, (p, r) in enumerate(zip(prompts, responses)):
                s = seqs[b]
                input_ids[b, :len(s) - 1] = s[:-1]
                labels[b, :len(s) - 1] = s[:-1]
                mask[b, len(p) - 1:len(p) - 1 + len(r)] = 1.0
            return input_ids, labels, mask
        """,
        "padded with 0 whatever pad_id": ("""
            seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
            T = max(len(s) for s in seqs) - 1
            input_ids = np.zeros((len(seqs), T), dtype=np.int64)
            labels = np.zeros((len(seqs), T), dtype=np.int64)
            mask = np.zeros((len(seqs), T), dtype=np.float32)
            for b, (p, r) in enumerate(zip(prompts, responses)):
                s = seqs[b]
                input_ids[b, :len(s) - 1] = s[:-1]
                labels[b, :len(s) - 1] = s[1:]
                mask[b, len(p) - 1:len(p) - 1 + len(r)] = 1.0
            return input_ids, labels, mask
        """, "pad id 99"),
    },
    "T20.2": {
        "softmax over the wrong axis": ("""
            z = logits - logits.max(axis=0, keepdims=True)
            e = np.exp(z)
            s = e.sum(axis=0, keepdims=True)
            return (np.log(s) - (e * z).sum(axis=0, keepdims=True) / s)[0]
        """, "small logits"),
        "no maximum subtracted": ("""
            e = np.exp(logits)
            s = e.sum(axis=-1, keepdims=True)
            return (np.log(s) - (e * logits).sum(axis=-1, keepdims=True) / s)[..., 0]
        """, "logits ~1000"),
        "p log p of underflowed probabilities": ("""
            z = logits - logits.max(axis=-1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
            return -(p * np.log(p)).sum(axis=-1)
        """, "one sure token"),
        "the minus sign forgotten": """
            z = logits - logits.max(axis=-1, keepdims=True)
            e = np.exp(z)
            s = e.sum(axis=-1, keepdims=True)
            return ((e * z).sum(axis=-1, keepdims=True) / s - np.log(s))[..., 0]
        """,
        "computed in float64": ("""
            z = np.asarray(logits, dtype=np.float64)
            z = z - z.max(axis=-1, keepdims=True)
            e = np.exp(z)
            s = e.sum(axis=-1, keepdims=True)
            return (np.log(s) - (e * z).sum(axis=-1, keepdims=True) / s)[..., 0]
        """, "float32 logits"),
    },
    "T20.3": {
        "divides by the number of sequences, not the constant": ("""
            m = np.asarray(mask, dtype=logp.dtype)
            return -ops.sum(logp * m) * (1.0 / logp.shape[0])
        """, "not by the number of sequences"),
        "the micro-batch's own token mean": """
            m = np.asarray(mask, dtype=logp.dtype)
            return -ops.sum(logp * m) * (1.0 / m.sum())
        """,
        "prompt and padding left in (mask ignored)": ("""
            return -ops.sum(logp) * (1.0 / normalize_constant)
        """, "multiply by the mask"),
        "sign flipped": """
            m = np.asarray(mask, dtype=logp.dtype)
            return ops.sum(logp * m) * (1.0 / normalize_constant)
        """,
        "float64 for float32 log-probs": ("""
            m = np.asarray(mask, dtype=np.float64)
            return -ops.sum(logp * m) * (1.0 / normalize_constant)
        """, "float32 log-probs"),
    },
    "T20.4": {
        "the first number, not the last": """
            num = r"-?\\d+(?:\\.\\d+)?"
            for pattern in (rf"<answer>\\s*({num})\\s*</answer>", rf"\\\\boxed\\{{\\s*({num})\\s*\\}}", rf"({num})"):
                found = re.findall(pattern, text)
                if found:
                    return float(found[0])
            return None
        """,
        "the last number, tags ignored": ("""
            found = re.findall(r"-?\\d+(?:\\.\\d+)?", text)
            return float(found[-1]) if found else None
        """, "a tag wins"),
        "whole positive numbers only": ("""
            for pattern in (r"<answer>\\s*(\\d+)\\s*</answer>", r"\\\\boxed\\{\\s*(\\d+)\\s*\\}", r"(\\d+)"):
                found = re.findall(pattern, text)
                if found:
                    return float(found[-1])
            return None
        """, "negative"),
        "a box before a tag": ("""
            num = r"-?\\d+(?:\\.\\d+)?"
            for pattern in (rf"\\\\boxed\\{{\\s*({num})\\s*\\}}", rf"<answer>\\s*({num})\\s*</answer>", rf"({num})"):
                found = re.findall(pattern, text)
                if found:
                    return float(found[-1])
            return None
        """, "a tag and a box"),
        "returns the text of the number": """
            num = r"-?\\d+(?:\\.\\d+)?"
            for pattern in (rf"<answer>\\s*({num})\\s*</answer>", rf"\\\\boxed\\{{\\s*({num})\\s*\\}}", rf"({num})"):
                found = re.findall(pattern, text)
                if found:
                    return found[-1]
            return None
        """,
    },
}
