"""T09: export to the Hugging Face layout, closed loop with transformers as the oracle.

The model is a small random-init Qwen3 (dim 64, 2 layers, 4 query heads sharing 2 kv heads,
head_dim 16). Random init at std 0.02 gives nearly flat logits, where greedy decoding picks
between near-ties; so the test model's weight matrices are scaled by 3 (std 0.06) and every
RMSNorm weight (incl. q_norm / k_norm) is set to 1 + 0.1 N(0, 1), which also makes a swapped
or misnamed norm visible. The smallest top-1/top-2 gap along the greedy runs is reported.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xtrain_lessons.interop.hf import (
    ExportError,
    closed_loop_check,
    config_from_hf,
    export_hf,
    hf_config,
    hf_tensor_names,
    import_hf,
)
from xtrain_lessons.training.rundir import load_run, save_run
from xtrain_lessons.model.qwen3 import Config, Model

DATA = Path(__file__).resolve().parents[1] / "data" / "stories.txt"
FALLBACK = ("Once upon a time there was a little girl named Lily. She liked to play in the park "
            "with her dog. One day, Tom saw a big red ball.\n\"Can I play?\" he asked. ") * 40

BF16_EPS = 2.0 ** -7  # spacing of bfloat16 numbers just above 1 (8 significant bits)

TEXTS = [  # for AutoTokenizer vs ours
    "Once upon a time",
    " leading space, and  two  spaces",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "café, naïve, Zürich — 日本語 🙂 ∑x²",
    "<|endoftext|>Next story<|endoftext|>",
    "   \n  ",
    "It's 3:45pm; they'd've said \"no\".",
]


def _story_text() -> str:
    return DATA.read_text(encoding="utf-8")[:100_000] if DATA.exists() else FALLBACK


@pytest.fixture(scope="module")
def tok():
    from xtrain_lessons.training.tokenizer import train_tokenizer_from_text

    return train_tokenizer_from_text(_story_text(), vocab_size=512)


def make_model(vocab: int, seed: int = 0, qk_norm: bool = True, scale: float = 3.0) -> Model:
    cfg = Config(vocab_size=vocab, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_dim=128, max_seq_len=160, qk_norm=qk_norm)
    model = Model(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    sd = model.state_dict()
    for k, v in sd.items():
        sd[k] = (v * scale if v.ndim == 2
                 else 1 + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
    model.load_state_dict(sd)
    return model


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok.get_vocab_size())


@pytest.fixture(scope="module")
def prompts(tok):
    text = _story_text()
    long = text[:200]
    while len(tok.encode(long).ids) <= 64:
        long += text[len(long):len(long) + 50]
    return ["Once upon a time", " there was a little girl\n", 'Tom said: "café — 日本語 🙂"', long]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model, tok):
    root = tmp_path_factory.mktemp("hf")
    return export_hf(model, tok, root / "fp32"), export_hf(model, tok, root / "bf16", dtype="bfloat16")


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def report_fp32(hf, model, tok, exported, prompts):
    r = closed_loop_check(model, tok, exported[0], prompts, n_tokens=40)
    print(r["summary"], f"(min greedy top-1 margin {r['min_greedy_margin']:.2g})")
    return r


@pytest.fixture(scope="module")
def report_bf16(hf, model, tok, exported, prompts):
    r = closed_loop_check(model, tok, exported[1], prompts, n_tokens=40)
    print(r["summary"], f"(relative drift {r['rel_dlogit']:.2g})")
    return r


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


# ----- the folder ------------------------------------------------------------------------

def test_folder_contents_and_config(exported, model):
    fp32, bf16 = exported
    for d in exported:
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"):
            assert (d / f).is_file(), f
    assert not list(fp32.parent.glob(".tmp-*")), "temporary directories left behind"
    cfg = json.loads((fp32 / "config.json").read_text())
    c = model.config
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (c.dim, c.ffn_dim, c.n_layers)
    # GQA: 4 query heads, 2 kv heads
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": c.rope_theta}
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False
    assert cfg["eos_token_id"] == 0 and cfg["dtype"] == "float32"
    assert json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((fp32 / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"

    header = {k: v for k, v in _safetensors_header(fp32 / "model.safetensors").items() if k != "__metadata__"}
    assert sorted(header) == sorted(hf_tensor_names(c)) and len(header) == 1 + 11 * c.n_layers + 2
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [2 * 16, 64]  # [out, in]
    assert header["model.layers.0.mlp.down_proj.weight"]["shape"] == [64, 128]
    assert {v["dtype"] for v in header.values()} == {"F32"}
    bf = _safetensors_header(bf16 / "model.safetensors")
    assert {v["dtype"] for k, v in bf.items() if k != "__metadata__"} == {"BF16"}


def test_transformers_config_matches(hf, exported, model):
    cfg = hf.AutoConfig.from_pretrained(exported[0])
    c = model.config
    assert type(cfg).__name__ == "Qwen3Config"
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim) == \
        (c.vocab_size, c.dim, c.n_kv_heads, c.head_dim)
    assert cfg.rms_norm_eps == c.norm_eps and cfg.max_position_embeddings == c.max_seq_len


def test_autotokenizer_ids_equal_ours(hf, exported, tok):
    auto = hf.AutoTokenizer.from_pretrained(exported[0])
    for text in TEXTS:
        ours = tok.encode(text, add_special_tokens=False).ids
        assert auto(text)["input_ids"] == ours, text  # no BOS added, same pre-tokenizer
        assert auto.decode(ours) == text
    assert auto.eos_token_id == 0 and auto.eos_token == "<|endoftext|>"


# ----- the closed loop -------------------------------------------------------------------

def test_fp32_logits_match_transformers(report_fp32, prompts, tok):
    assert max(len(tok.encode(p).ids) for p in prompts) > 64  # one prompt longer than 64 tokens
    assert report_fp32["tokenizer_ids_equal"] is True
    assert report_fp32["max_abs_dlogit"] < 1e-4, report_fp32["summary"]
    assert report_fp32["top1_agreement"] == 1.0


def test_fp32_greedy_token_identical(report_fp32):
    assert report_fp32["n_prompts"] >= 3
    assert all(report_fp32["greedy_identical"]), report_fp32
    assert report_fp32["summary"].startswith("transformers (float32): greedy 40 tokens identical on 4/4")


def test_bf16_drift_and_top1(report_bf16):
    # bf16 rounds weights and activations to 8 significant bits (relative error <= eps/2 each);
    # through a 2-layer model the logits drift by a few eps relative to their scale
    assert report_bf16["hf_dtype"] == "bfloat16"
    assert 0 < report_bf16["rel_dlogit"] < 6 * BF16_EPS, report_bf16["summary"]
    assert report_bf16["top1_agreement"] >= 0.9, report_bf16["summary"]


def test_closed_loop_without_transformers(monkeypatch, model, tok, exported):
    monkeypatch.setitem(sys.modules, "transformers", None)
    r = closed_loop_check(model, tok, exported[0], ["Once"])
    assert r["available"] is False and "not checked" in r["summary"]


# ----- import ----------------------------------------------------------------------------

def test_export_import_identity(exported, model, tok):
    m2, t2 = import_hf(exported[0])
    assert m2.config == model.config
    a, b = model.state_dict(), m2.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32 and np.array_equal(a[k], b[k]), k
    assert json.loads(t2.to_str()) == json.loads(tok.to_str())


def test_bf16_import_is_the_rounded_weights(exported, model):
    import ml_dtypes

    m2, _ = import_hf(exported[1])
    for k, v in model.state_dict().items():
        expect = v.astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(m2.state_dict()[k], expect), k
        assert np.abs(expect - v).max() <= BF16_EPS / 2 * np.abs(v).max() + 1e-30


def test_bf16_import_in_a_fresh_process(exported, model):
    """Reading BF16 needs numpy to know "bfloat16" (ml_dtypes): import_hf must see to it."""
    code = ("import sys, numpy as np; from xtrain_lessons.interop.hf import import_hf; "
            "m, _ = import_hf(sys.argv[1]); print(m.state_dict()['lm_head.weight'].dtype)")
    res = subprocess.run([sys.executable, "-c", code, str(exported[1])], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "float32", res.stderr[-2000:]


def test_tied_embeddings_are_untied(tmp_path, exported, model):
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "tied"
    shutil.copytree(exported[0], d)
    w = load_file(str(d / "model.safetensors"))
    del w["lm_head.weight"]
    save_file(w, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    m2, _ = import_hf(d)
    sd = m2.state_dict()
    assert np.array_equal(sd["lm_head.weight"], model.state_dict()["model.embed_tokens.weight"])


def test_import_a_folder_saved_by_transformers(hf, tmp_path, exported):
    """A Qwen3 written by transformers itself (tied embeddings, rope_theta 1e6) imports and
    computes the same logits."""
    import torch

    torch.manual_seed(0)
    cfg = hf.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=64, tie_word_embeddings=True, rope_theta=1e6)
    theirs = hf.Qwen3ForCausalLM(cfg).eval()
    theirs.save_pretrained(tmp_path / "q")
    shutil.copy(exported[0] / "tokenizer.json", tmp_path / "q" / "tokenizer.json")
    ours, _ = import_hf(tmp_path / "q")
    assert (ours.config.rope_theta, ours.config.n_kv_heads, ours.config.ffn_dim) == (1e6, 2, 96)
    ids = np.random.default_rng(0).integers(0, 300, (1, 50))
    from xtrain_lessons.autograd.tensor import no_grad

    with no_grad():
        a = ours(ids).numpy()
    with torch.no_grad():
        b = theirs(torch.tensor(ids)).logits.numpy()
    assert np.abs(a - b).max() < 1e-4


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "unsupported architecture"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "RoPE scaling"),
    ({"use_sliding_window": True}, "sliding"),
    ({"hidden_act": "gelu"}, "silu"),
])
def test_unsupported_configs_are_clear_errors(tmp_path, exported, change, message):
    d = tmp_path / "bad"
    shutil.copytree(exported[0], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=message):
        import_hf(d)


def test_missing_config_and_weights_are_clear_errors(tmp_path, exported):
    with pytest.raises(ExportError, match="config.json is missing"):
        import_hf(tmp_path)
    d = tmp_path / "noweights"
    shutil.copytree(exported[0], d)
    (d / "model.safetensors").unlink()
    with pytest.raises(ExportError, match="model.safetensors"):
        import_hf(d)


def test_config_mapping_round_trip(model):
    assert config_from_hf(hf_config(model.config)) == model.config
    legacy = hf_config(model.config)
    del legacy["rope_parameters"]  # transformers 4.x style: top-level rope_theta only
    assert config_from_hf(legacy).rope_theta == model.config.rope_theta


# ----- export refusals and atomicity -----------------------------------------------------

def test_qk_norm_off_is_refused(tmp_path, tok):
    # Qwen3 in transformers always normalises each q/k head; with weight 1 that still rescales
    # the head to unit RMS, so an exported qk_norm=False model would compute something else
    m = make_model(tok.get_vocab_size(), qk_norm=False)
    with pytest.raises(ExportError, match="qk_norm=False"):
        export_hf(m, tok, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_qk_norm_with_unit_weights_is_not_the_identity(tok):
    """Why qk_norm=False is refused rather than exported with q_norm = k_norm = ones."""
    from xtrain_lessons.autograd.tensor import no_grad

    plain = make_model(tok.get_vocab_size(), qk_norm=False, scale=1.0)
    normed = Model(plain.config.replace(qk_norm=True), seed=0)
    sd = plain.state_dict()
    normed.load_state_dict({k: sd.get(k, np.ones(v.shape, np.float32))
                            for k, v in normed.state_dict().items()})
    ids = np.random.default_rng(0).integers(0, plain.config.vocab_size, (1, 40))
    with no_grad():
        a, b = plain(ids).numpy(), normed(ids).numpy()
    assert np.abs(a - b).max() > 0.05 * np.abs(a).max()  # a different model, not eps away


def test_export_replaces_an_export_but_not_other_folders(tmp_path, model, tok):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="refusing"):
        export_hf(model, tok, other)
    assert (other / "keep.txt").read_text() == "mine"
    out = export_hf(model, tok, tmp_path / "hf")
    export_hf(model, tok, out, dtype="bfloat16")  # an earlier export is replaced
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "notes"]  # no temp dirs left


def test_bad_dtype(tmp_path, model, tok):
    with pytest.raises(ExportError, match="dtype"):
        export_hf(model, tok, tmp_path / "x", dtype="float16")


# ----- run directories and the CLI -------------------------------------------------------

def test_cli_export_and_import_round_trip(tmp_path, model, tok, capsys):
    from xtrain_lessons.cli import main

    run = tmp_path / "run"
    save_run(model, tok, run, step=7)
    assert main.main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert "25 tensors" in capsys.readouterr().out  # embed + 11 per layer x 2 + norm + lm_head
    assert main.main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run2")]) == 0
    m2, t2, ckpt = load_run(tmp_path / "run2")
    assert ckpt.path.name == "step_00000000"
    for k, v in model.state_dict().items():
        assert np.array_equal(m2.state_dict()[k], v), k
    assert main.main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "hf2")]) == 1
    assert "xtrain export:" in capsys.readouterr().err
    assert main.main(["import-hf", str(tmp_path / "nothing"), "--out", str(tmp_path / "run3")]) == 1
    assert "config.json is missing" in capsys.readouterr().err


def test_export_a_real_training_run(hf, tmp_path, capsys):
    """`xtrain train` run directory -> `xtrain export --check`: the layout the trainer writes."""
    from xtrain_lessons.cli import main
    from xtrain_lessons.training.config import TrainConfig
    from xtrain_lessons.training.loop import train

    corpus = tmp_path / "corpus.txt"
    text = _story_text()[:30_000]
    if "<|endoftext|>" in text:  # whole documents only
        text = text[: text.rfind("<|endoftext|>")] + "<|endoftext|>\n"
    corpus.write_text(text, encoding="utf-8")
    cfg = TrainConfig(preset="test", data=str(corpus), out=str(tmp_path / "run"), vocab_size=300,
                      steps=6, batch_size=4, seq_len=16, warmup=2, eval_every=0, sample_every=0,
                      sample_tokens=0, checkpoint_every=0)
    result = train(cfg, progress=False, log=lambda s: None)
    code = main.main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--check",
                     "--prompt", "Once upon a time", "--prompt", "The dog", "--tokens", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "greedy 16 tokens identical on 2/2 prompts" in out
    m2, _ = import_hf(tmp_path / "hf")
    for k, v in result.model.state_dict().items():
        assert np.array_equal(m2.state_dict()[k], v), k
