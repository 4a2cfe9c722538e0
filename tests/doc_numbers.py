"""A doc's prose quotes no number that none of its results blocks shows (docs/model.md,
docs/evaluation.md): a number either sits in a block a test keeps in sync with the results files, or
it goes."""

from __future__ import annotations

import re

BLOCK = re.compile(r"<!-- results:([\w.-]+) -->\n(.*?)<!-- /results:\1 -->", re.S)
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])")


def stray_numbers(text: str, names: dict, min_blocks: int = 1) -> list[str]:
    """Numbers in ``text``'s prose (outside results blocks, fenced and inline code, link targets
    and list numbering) that no block shows and that are not in ``names`` (numbers that are names,
    not measurements or settings: number -> why)."""
    blocks = [m.group(2) for m in BLOCK.finditer(text)]
    assert len(blocks) >= min_blocks, f"expected at least {min_blocks} results blocks, found {len(blocks)}"
    shown = {n for b in blocks for n in NUMBER.findall(b)}
    prose = BLOCK.sub("", text)
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)  # commands and example output
    prose = re.sub(r"`[^`\n]*`", "", prose)  # code: names, paths, flags
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    prose = re.sub(r"(?m)^\s*\d+\. ", "", prose)  # list numbering
    return sorted({n for n in NUMBER.findall(prose) if n not in shown and n not in names})
