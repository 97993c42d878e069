"""`xtrain data`: fetch against a local HTTP server (success, bad sha256, 404, cut-off), prepare, stats."""

import argparse
import hashlib
import http.server
import threading

import pytest

from xtrain_lessons.cli import data as data_cli
from xtrain_lessons.training.data.fetch import FetchError, download, fetch, to_eot_lines
from xtrain_lessons.training.tokenizer import EOT

# TinyStories' own layout: stories separated by <|endoftext|> lines (with ragged whitespace).
BODY = (f"Once upon a time there was a cat.\nThe cat was happy.\n{EOT}\n"
        f"  Tom had a red ball. He liked to play.  \n\n{EOT}\nThe end. Café.\n").encode("utf-8")
SHA = hashlib.sha256(BODY).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/stories.txt":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
        elif self.path == "/cut":  # promises more bytes than it sends, then hangs up
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY) * 10))
            self.end_headers()
            self.wfile.write(BODY)
            self.close_connection = True
        else:
            self.send_error(404, "Not Found")

    def log_message(self, *args):  # keep test output quiet
        pass


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def run_cli(*argv) -> int:
    parser = argparse.ArgumentParser(prog="xtrain data")
    data_cli.configure_parser(parser)
    return data_cli.run(parser.parse_args([str(a) for a in argv]))


def test_download_ok(server, tmp_path):
    dest = tmp_path / "x.txt"
    assert download(f"{server}/stories.txt", dest, sha256=SHA, progress=False) == SHA
    assert dest.read_bytes() == BODY
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_fetch_converts_to_eot_lines(server, tmp_path, capsys):
    path = fetch("tinystories", tmp_path, url=f"{server}/stories.txt", sha256=SHA, progress=False)
    assert path == tmp_path / "tinystories-valid.txt"
    text = path.read_text(encoding="utf-8")
    assert text == ("Once upon a time there was a cat.\nThe cat was happy.\n<|endoftext|>\n"
                    "Tom had a red ball. He liked to play.\n<|endoftext|>\nThe end. Café.\n")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary or raw file left
    assert f"sha256 {SHA} OK" in capsys.readouterr().out


def test_fetch_with_the_right_sha256(server, tmp_path, capsys):
    assert run_cli("fetch", "tinystories", "--out", tmp_path, "--url", f"{server}/stories.txt",
                   "--sha256", SHA.upper(), "--quiet") == 0
    assert f"{SHA} OK" in capsys.readouterr().out


def test_sha256_mismatch_leaves_no_file(server, tmp_path, capsys):
    with pytest.raises(FetchError, match="sha256 mismatch"):
        fetch("tinystories", tmp_path, url=f"{server}/stories.txt", sha256="0" * 64, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert run_cli("fetch", "tinystories", "--out", tmp_path, "--url", f"{server}/stories.txt",
                   "--sha256", "0" * 64, "--quiet") == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_http_404_is_a_clear_error(server, tmp_path, capsys):
    with pytest.raises(FetchError, match="HTTP 404"):
        download(f"{server}/missing.txt", tmp_path / "m.txt", progress=False)
    assert run_cli("fetch", "tinystories", "--out", tmp_path, "--url", f"{server}/nope", "--sha256", SHA,
                   "--quiet") == 1
    assert "HTTP 404" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cut_off_download_leaves_no_file(server, tmp_path):
    with pytest.raises(FetchError, match="interrupted"):
        download(f"{server}/cut", tmp_path / "c.txt", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_server(tmp_path):
    with pytest.raises(FetchError, match="cannot reach"):
        download("http://127.0.0.1:9/x", tmp_path / "x", progress=False, timeout=5)
    assert list(tmp_path.iterdir()) == []


def test_existing_file_survives_a_failed_download(server, tmp_path):
    dest = tmp_path / "tinystories-valid.txt"
    dest.write_text("old copy")
    with pytest.raises(FetchError):
        fetch("tinystories", tmp_path, url=f"{server}/nope", sha256=SHA, progress=False)
    assert dest.read_text() == "old copy"


def test_to_eot_lines():
    assert to_eot_lines(f"a{EOT}b\n\n{EOT}\n\n{EOT}c") == f"a\n{EOT}\nb\n{EOT}\nc\n"
    assert to_eot_lines("just one story") == "just one story\n"


def test_prepare_and_stats_cli(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(f"\n{EOT}\n".join(f"Story {i}. Lily and Tom played with a ball." for i in range(30)),
                    encoding="utf-8")
    out = tmp_path / "prep"
    assert run_cli("prepare", text, "--out", out, "--vocab-size", "300", "--val-fraction", "0.1") == 0
    said = capsys.readouterr().out
    assert "27 docs" in said and "3 docs" in said and "bytes/token" in said
    assert run_cli("stats", out) == 0
    said = capsys.readouterr().out
    assert "vocab " in said and "train" in said and "Story" in said
    # reuse the saved tokenizer
    assert run_cli("prepare", text, "--out", tmp_path / "p2", "--tokenizer", out / "tokenizer.json") == 0
    assert (tmp_path / "p2" / "train.bin").read_bytes() != b""


def test_cli_errors(tmp_path, capsys):
    assert run_cli("stats", tmp_path / "nothing") == 1
    assert "xtrain data prepare" in capsys.readouterr().err
    assert run_cli("prepare", tmp_path / "missing.txt", "--out", tmp_path / "o") == 1
    assert "not found" in capsys.readouterr().err
    assert run_cli() == 2


def test_registered_in_the_xtrain_command():
    from xtrain_lessons.cli.main import SUBCOMMANDS

    assert ("data", "xtrain_lessons.cli.data") in SUBCOMMANDS
    assert data_cli.__doc__.strip().splitlines()[0]
