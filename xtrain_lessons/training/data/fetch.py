"""Download a known corpus (TinyStories) with its checksum verified.

    from xtrain_lessons.training.data.fetch import fetch
    path = fetch("tinystories", "data")      # data/TinyStories-valid.txt, <|endoftext|> lines

`fetch` downloads to a temporary file and renames it only when the download is complete and
its sha256 is right, so an interrupted or bad download leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from xtrain_lessons.training.tokenizer import EOT, atomic_write_bytes

# Files `fetch` knows, with the sha256 of the file as downloaded. None = not pinned: it could
# not be computed from a verified download when this version was written (no network), so
# `fetch` refuses to run without --sha256 rather than accept whatever bytes arrive.
KNOWN_FILES = {
    "tinystories": {
        "url": "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories-valid.txt",
        "filename": "tinystories-valid.txt",
        "sha256": None,
        "about": "TinyStories validation split (Eldan & Li 2023, CDLA-Sharing-1.0), about 19 MB",
    },
}


class FetchError(RuntimeError):
    """A download that failed; nothing was written."""


# --------------------------------------------------------------------------- fetch
def download(url: str, dest: Path, sha256: str | None = None, progress: bool = True,
             timeout: float = 60.0) -> str:
    """Download `url` to `dest` atomically; return the sha256 of the bytes.

    Raises FetchError (and leaves no file) on an HTTP error, a short read, or a sha256 mismatch.
    """

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    f = os.fdopen(fd, "wb")
    h = hashlib.sha256()
    try:
        try:
            resp = urllib.request.urlopen(url, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise FetchError(f"download failed: HTTP {e.code} {e.reason} for {url}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FetchError(f"download failed: cannot reach {url} ({reason})") from None
        with resp:
            total = resp.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
            n = 0
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                      desc=dest.name, disable=not progress, file=sys.stderr) as bar:
                while True:
                    try:
                        chunk = resp.read(1 << 16)
                    except Exception as e:  # http.client.IncompleteRead, connection reset, timeout
                        raise FetchError(f"download interrupted after {n} bytes: {e!r}") from None
                    if not chunk:
                        break
                    f.write(chunk)
                    h.update(chunk)
                    n += len(chunk)
                    bar.update(len(chunk))
            if total is not None and n != total:
                raise FetchError(f"download interrupted: got {n} of {total} bytes from {url}")
        f.close()
        digest = h.hexdigest()
        if sha256 is not None and digest != sha256.lower():
            raise FetchError(f"sha256 mismatch for {url}: expected {sha256.lower()}, got {digest}. "
                             "The file was not saved")
        os.replace(tmp, dest)
        return digest
    except BaseException:
        f.close()
        Path(tmp).unlink(missing_ok=True)
        raise


def to_eot_lines(text: str) -> str:
    """Normalise document separators to our format: each EOT on a line of its own."""
    docs = [d.strip() for d in text.split(EOT)]
    return f"\n{EOT}\n".join(d for d in docs if d) + "\n"


def fetch(name: str, out_dir: str | os.PathLike = "data", url: str | None = None,
          sha256: str | None = None, progress: bool = True) -> Path:
    """Download a known file into `out_dir` in our `<|endoftext|>` line format; return its path."""
    if name not in KNOWN_FILES:
        raise FetchError(f"unknown dataset {name!r}; known: {', '.join(KNOWN_FILES)}")
    entry = KNOWN_FILES[name]
    url = url or entry["url"]
    sha256 = sha256 or entry["sha256"]
    if sha256 is None:
        raise FetchError(f"no sha256 is pinned for {name!r} in this version of xtrain-lessons, and a "
                         f"download that cannot be verified is refused: pass --sha256 HEX (the checksum "
                         f"of {entry['filename']} from a source you trust); nothing was downloaded")
    if len(sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha256):
        raise FetchError(f"--sha256 must be 64 hexadecimal digits, got {sha256!r}")
    out_dir = Path(out_dir)
    dest = out_dir / entry["filename"]
    raw = out_dir / f".{entry['filename']}.download"  # hidden; removed below whatever happens
    digest = download(url, raw, sha256=sha256, progress=progress)
    try:
        print(f"sha256 {digest} OK")
        data = raw.read_bytes()
        text = data.decode("utf-8", errors="replace")
        n_bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
        if n_bad:
            print(f"note: {n_bad} invalid UTF-8 byte sequence(s) replaced by U+FFFD")
        atomic_write_bytes(dest, to_eot_lines(text).encode("utf-8"))
    finally:
        raw.unlink(missing_ok=True)
    return dest
