"""`xtrain eval`: loss and bits per byte over the whole file, against a direct computation."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from xtrain_lessons.cli import eval
from xtrain_lessons.measure.evaluate import EvalError, evaluate_run
from xtrain_lessons.training.tokenizer import EOT
from xtrain_lessons.training.config import TrainConfig
from xtrain_lessons.training.rundir import load_run
from xtrain_lessons.training.loop import train

from test_train import small_corpus  # noqa: E402  (tests/ is on sys.path under pytest)

SEQ = 16


def _run(tmp: Path, corpus: Path, vocab: int) -> Path:
    cfg = TrainConfig(preset="test", data=str(corpus), vocab_size=vocab, steps=3, batch_size=4,
                      seq_len=SEQ, warmup=1, eval_every=0, sample_every=0, sample_tokens=0,
                      checkpoint_every=0, threads=1, out=str(tmp / f"run{vocab}"))
    return train(cfg, progress=False, log=lambda m: None).run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    corpus = small_corpus(tmp / "corpus.txt", 20_000)
    held = tmp / "held.txt"  # 5 documents, the last one not ending in EOT, a blank one between
    docs = small_corpus(tmp / "more.txt", 60_000).read_text(encoding="utf-8").split(EOT)[-8:-3]
    held.write_text(f"\n{EOT}\n".join(docs[:3]) + f"\n{EOT}\n\n{EOT}\n" + "\n".join(docs[3:]),
                    encoding="utf-8")
    return {"a": _run(tmp, corpus, 300), "b": _run(tmp, corpus, 400), "held": held, "tmp": tmp}


def _direct(run_dir: Path, text_path: Path, T: int) -> tuple[float, int, int]:
    """Mean loss (via model.loss, float32) over the windows the docstring describes, the
    number of predictions and the bytes, computed here from scratch."""
    model, tok, _ = load_run(run_dir)
    model.eval()
    docs = [d.strip() for d in text_path.read_text(encoding="utf-8").split(EOT)]
    docs = [d for d in docs if d]
    eot = tok.token_to_id(EOT)
    ids = [eot]
    for d in docs:
        ids += tok.encode(d, add_special_tokens=False).ids + [eot]
    total, n = 0.0, 0
    for s in range(0, len(ids) - 1, T):
        x, y = ids[s:s + T], ids[s + 1:s + T + 1]
        x = x[:len(y)]
        total += float(model.loss([x], [y]).item()) * len(y)
        n += len(y)
    assert n == len(ids) - 1
    return total / n, n, sum(len(d.encode("utf-8")) + 1 for d in docs)


def test_matches_direct_computation(runs):
    r = evaluate_run(runs["a"], runs["held"])
    loss, n, n_bytes = _direct(runs["a"], runs["held"], SEQ)
    assert r["n_tokens"] == n and r["n_bytes"] == n_bytes
    assert (n % SEQ) != 0  # the file ends in a short window, which is scored too
    assert r["n_windows"] == math.ceil(n / SEQ)
    assert abs(r["loss"] - loss) <= 1e-6
    assert abs(r["bits_per_byte"] - loss * n / math.log(2) / n_bytes) <= 1e-6
    assert abs(r["ppl"] - math.exp(r["loss"])) <= 1e-6 * r["ppl"]
    # another window length: different windows, again equal to the direct computation
    r7 = evaluate_run(runs["a"], runs["held"], seq_len=7)
    assert abs(r7["loss"] - _direct(runs["a"], runs["held"], 7)[0]) <= 1e-6


def test_bytes_do_not_depend_on_the_tokenizer(runs):
    ra, rb = evaluate_run(runs["a"], runs["held"]), evaluate_run(runs["b"], runs["held"])
    assert ra["n_bytes"] == rb["n_bytes"]
    assert ra["n_tokens"] != rb["n_tokens"]  # 300 vs 400 tokens of vocabulary


def test_batch_size_does_not_change_the_result(runs):
    r1 = evaluate_run(runs["a"], runs["held"], batch_size=1)
    r16 = evaluate_run(runs["a"], runs["held"], batch_size=16)
    assert abs(r1["loss"] - r16["loss"]) <= 1e-6


@pytest.mark.parametrize("case, needle", [
    ("missing_run", "not a run directory"),
    ("no_checkpoint", "checkpoint"),
    ("missing_file", "not found"),
    ("empty_file", "is empty"),
    ("only_separators", "empty"),
    ("short_file", "fewer than one window"),
])
def test_bad_input_gives_one_clear_line(runs, tmp_path, capsys, case, needle):
    run, data = runs["a"], runs["held"]
    if case == "missing_run":
        run = tmp_path / "nope"
    elif case == "no_checkpoint":
        run = tmp_path / "bare"
        run.mkdir()
        (run / "config.json").write_text((runs["a"] / "config.json").read_text())
        (run / "tokenizer.json").write_text((runs["a"] / "tokenizer.json").read_text())
    elif case == "missing_file":
        data = tmp_path / "nope.txt"
    elif case == "empty_file":
        data = tmp_path / "empty.txt"
        data.write_text("")
    elif case == "only_separators":
        data = tmp_path / "eot.txt"
        data.write_text(f"\n{EOT}\n  \n{EOT}\n")
    elif case == "short_file":
        data = tmp_path / "short.txt"
        data.write_text("Once upon a time.")
    with pytest.raises(EvalError, match=needle):
        evaluate_run(run, data)
    p = argparse.ArgumentParser()
    eval.configure_parser(p)
    assert eval.run(p.parse_args([str(run), "--data", str(data)])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xtrain eval: error:") and len(err.splitlines()) == 1 and needle in err


def test_cli_json_line(runs, capsys):
    p = argparse.ArgumentParser()
    eval.configure_parser(p)
    assert eval.run(p.parse_args([str(runs["a"]), "--data", str(runs["held"]), "--json"])) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    r = json.loads(out[0])
    assert r == pytest.approx(evaluate_run(runs["a"], runs["held"]))
