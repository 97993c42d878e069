"""Print one of the README's two set-up commands: `main` or `test`.

The README marks each with an HTML comment (<!-- main-command -->, <!-- test-command -->)
right before its fenced code block, so CI and the tests run exactly what a user reads.
"""

import re
import sys
from pathlib import Path


def readme_command(which: str, readme: Path = Path(__file__).resolve().parents[1] / "README.md") -> str:
    text = readme.read_text(encoding="utf-8")
    m = re.search(rf"<!-- {which}-command -->\s*```(?:bash|sh)?\n(.+?)\n```", text, re.S)
    if not m:
        raise SystemExit(f"README.md has no <!-- {which}-command --> code block")
    lines = [ln for ln in m.group(1).splitlines() if ln.strip()]
    if len(lines) != 1:
        raise SystemExit(f"the README's {which} command must be one line, found {len(lines)}")
    return lines[0]


if __name__ == "__main__":
    print(readme_command(sys.argv[1] if len(sys.argv) > 1 else "test"))
