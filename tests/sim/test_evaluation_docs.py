"""docs/evaluation.md quotes no number in its prose that none of its results blocks shows: the
blocks are rendered from docs/results/*.json and the code's settings (bench/sim_render.py, kept in
sync by tests/sim/test_results_docs.py), so a number either sits in one or it goes."""

from pathlib import Path

from tests.doc_numbers import stray_numbers

DOC = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"
# numbers in the prose that are names, not measurements or settings
NAMES = {"4.0": "the trace's licence, CC BY 4.0", "23": "SC'23, the venue of the trace's paper"}


def test_every_number_in_the_prose_is_one_a_block_shows():
    stray = stray_numbers(DOC.read_text(), NAMES, min_blocks=4)
    assert not stray, f"numbers in docs/evaluation.md's prose that no block shows: {stray}"


def test_a_number_only_the_prose_quotes_is_found():
    text = DOC.read_text().replace("## Limits", "## Limits\n\nThe widening reads q0.98 at about 0.982.", 1)
    assert stray_numbers(text, NAMES) == ["0.982"]
