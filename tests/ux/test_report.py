"""`chainrun report` on a chain written into a store: summary numbers, PNG content, HTML page."""

from __future__ import annotations

import json
import re

import pytest

from chainrun.chain.summary import view_chain
from chainrun.report.timeline import build_timeline, summarize
from tests.conftest import run_cli
from tests.ux.fixtures import T0, make_chain


@pytest.fixture
def store(chainrun_home):
    s = make_chain(chainrun_home)
    yield s
    s.close()


def view(store, chain="train-abcd"):
    return view_chain(store.chain(chain), store.segments(chain), now=T0 + 10_000)


def test_timeline_has_bars_gaps_overlaps_and_predictions(store):
    tl = build_timeline(view(store), now=T0 + 10_000)
    assert [b.idx for b in tl.bars] == [0, 1, 2, 3]
    assert [(s.idx, s.kind, round(s.seconds)) for s in tl.spans] == [(1, "gap", 900), (2, "gap", 60), (3, "overlap", 180)]
    gap = tl.gaps[0]
    assert gap.start == T0 + 3720 and gap.end == T0 + 4620  # seg 0's end to seg 1's start
    assert [w.predicted_wait_s for w in tl.waits if w.predicted_wait_s is not None] == [300, 90, 700]
    assert tl.t0 == T0 and tl.t1 >= T0 + 9000


def test_summary_numbers(store):
    s = summarize(view(store))
    assert s["segments"] == 4 and s["retries"] == 1 and s["crashes"] == 1
    assert s["interruption_s"] == 960 and s["gaps"] == 2 and s["longest_gap_s"] == 900
    assert s["overlap_s"] == 180 and s["overlaps"] == 1
    assert s["predicted_vs_actual"][0] == {"predicted_s": 300, "actual_s": 1620}
    assert s["prediction_mae_s"] == pytest.approx((1320 + 30 + 120) / 3)


def test_ongoing_interruption_is_a_gap(chainrun_home):
    st = make_chain(chainrun_home, "live-0001", status="ACTIVE")
    try:
        ch = st.chain("live-0001")
        ch.finished = None
        st.save_chain(ch)
        last = st.segments(ch.id)[-1]
        v = view_chain(st.chain(ch.id), st.segments(ch.id), now=last.end + 500)
        tl = build_timeline(v, now=last.end + 500)
        assert tl.spans[-1].kind == "gap" and tl.spans[-1].start == last.end and tl.spans[-1].seconds == 500
    finally:
        st.close()


def test_png_has_segments_and_gaps(store, tmp_path):
    pytest.importorskip("matplotlib")
    from chainrun.report.plot import render_png

    out = tmp_path / "t.png"
    meta = render_png(build_timeline(view(store), now=T0 + 10_000), out)
    assert meta["bars"] == 4 and meta["gaps"] == 2 and meta["overlaps"] == 1 and meta["predicted"] == 3
    assert png_size(out) == (meta["width"], meta["height"])
    assert 600 <= meta["width"] <= 2000 and 150 <= meta["height"] <= 1200


def test_report_cli_json_png_html(store, chainrun_home, tmp_path):
    store.close()
    png, page = tmp_path / "t.png", tmp_path / "t.html"
    p = run_cli("report", "train", "--png", str(png), "--html", str(page), "--json", home=chainrun_home)
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)
    assert set(env) == {"chainrun", "schema", "command", "data"} and env["command"] == "report"
    d = env["data"]
    assert d["chain"] == "train-abcd" and d["interruption_s"] == 960 and d["overlap_s"] == 180
    assert d["files"]["png"]["bars"] == 4 and d["files"]["png"]["gaps"] == 2
    assert len(d["timeline"]["bars"]) == 4
    assert png_size(png) == (d["files"]["png"]["width"], d["files"]["png"]["height"])
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text
    assert text.count('class="gap"') == 2 and text.count('class="overlap"') == 1
    assert text.count('class="segment ') == 4 and text.count('class="predicted"') == 3
    assert not re.search(r"(?:src|href)\s*=|https?://|url\((?!#)", text), "the page must be self-contained"
    import xml.etree.ElementTree as ET

    svg = ET.fromstring(text[text.index("<svg"):text.index("</svg>") + 6])  # well-formed
    assert svg.tag == "svg" and int(svg.get("width")) == 900
    assert not list(tmp_path.glob(".*tmp*")), "no temporary files left behind"


def test_report_cli_table_and_list(store, chainrun_home):
    store.close()
    p = run_cli("report", "train-abcd", home=chainrun_home)
    assert p.returncode == 0, p.stderr
    assert "interruption" in p.stdout and "15m" in p.stdout and "3m" in p.stdout
    p = run_cli("report", home=chainrun_home)
    assert p.returncode == 0 and "train-abcd" in p.stdout
    p = run_cli("report", "--json", home=chainrun_home)
    assert json.loads(p.stdout)["data"][0]["retries"] == 1


@pytest.mark.parametrize("args,code,fragment", [
    (["report", "nope"], 3, "no chain"),
    (["report", "--png", "x.png"], 2, "draw one chain"),
    (["report", "train", "--html", "/nonexistent/dir/x.html"], 2, "does not exist"),
])
def test_report_errors_one_line(store, chainrun_home, args, code, fragment):
    store.close()
    p = run_cli(*args, home=chainrun_home)
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr and fragment in p.stderr


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_png_without_matplotlib_is_a_usage_error_and_html_still_works(store, chainrun_home, tmp_path):
    store.close()
    fake = tmp_path / "nomatplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = {"PYTHONPATH": str(fake.parent)}
    p = run_cli("report", "train", "--png", str(tmp_path / "t.png"), home=chainrun_home, env=env)
    assert p.returncode == 2 and "needs matplotlib" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "t.png").exists()
    p = run_cli("report", "train", "--html", str(tmp_path / "t.html"), home=chainrun_home, env=env)
    assert p.returncode == 0 and (tmp_path / "t.html").exists()


def test_png_legend_clears_the_throughput_axis(store, tmp_path):
    """The legend sat at the axes' right edge, over the steps/s axis's ticks and label (a real chain's report)."""
    pytest.importorskip("matplotlib")
    from chainrun.report.plot import render_png
    from chainrun.report.timeline import Rate

    tl = build_timeline(view(store), now=T0 + 10_000)
    tl.rates += [Rate(b.idx, b.start, b.end, 2.0, None, 100) for b in tl.bars]
    meta = render_png(tl, tmp_path / "t.png")
    twin = meta["artists"]["throughput"][0].axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = twin.figure
    renderer = FigureCanvasAgg(fig).get_renderer()  # closed after saving: measure it again as it was drawn
    (legend,) = fig.legends
    assert legend.get_window_extent(renderer).x0 >= twin.get_tightbbox(renderer).x1
    assert legend.get_window_extent(renderer).x1 <= fig.bbox.x1  # and is still in the picture


def test_png_to_a_file_named_otherwise_is_still_a_png(store, chainrun_home, tmp_path):
    """`report --png x.txt` was an internal error (exit 70): matplotlib took the format from the name."""
    pytest.importorskip("matplotlib")
    store.close()
    out = tmp_path / "timeline.txt"
    p = run_cli("report", "train", "--png", str(out), home=chainrun_home)
    assert p.returncode == 0, p.stderr
    assert png_size(out)[0] > 0 and not list(tmp_path.glob(".*.tmp*"))
