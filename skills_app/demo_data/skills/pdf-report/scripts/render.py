"""Render a small Markdown file into a one-column PDF (fictional example script).

Usage: python render.py INPUT.md OUTPUT.pdf
"""

import sys


def render(markdown: str) -> bytes:
    lines = [line.rstrip() for line in markdown.splitlines()]
    text = "\\n".join(line.replace("(", "[").replace(")", "]") for line in lines)
    stream = f"BT /F1 11 Tf 50 780 Td ({text}) Tj ET".encode("latin-1", "replace")
    return b"%PDF-1.4\n% rendered by pdf-report\n" + stream + b"\n%%EOF\n"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as source:
        pdf = render(source.read())
    with open(argv[2], "wb") as target:
        target.write(pdf)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
