"""The HTML report: self-contained, the expected tables and charts, escaped text; rendered in headless Chromium."""

from __future__ import annotations

import html.parser
import os
import shutil
import struct
import subprocess
import zlib

import numpy as np
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.report import html_page as html_report, optimize_report as report
from dmlopt.runtime import bench
from tests.conftest import conv_leaky_model

AFTER_BLUE = (0x2F, 0x6F, 0xD6)


def _half_first(models, target, *, baseline=None, **kw):
    """bench.compare for tuning with float16 measured faster and the tuned result fastest: the page then
    has a fixed set of charts and passes (the real timings of these tiny models are noise)."""
    def ms(name, m):
        half = any(v.dtype == ir.DataType.FLOAT16 for v in m.graph.initializers.values())
        return (1.0 if half else 2.0) + (0.0 if name == "tuned" else 0.5)

    times = {name: ms(name, m) for name, m in models.items()}
    base = baseline or next(iter(models))
    return {"provider": "CPUExecutionProvider", "baseline": base, "models": {
        name: {"latency_ms": {"median": t, "min": t, "p90": t}, "ratio_median": t / times[base], "copies": 0}
        for name, t in times.items()}}


@pytest.fixture(scope="module")
def rep():
    """A real report: fp16 tuned on the CPU EP (fake timings), re-timed, with the predicted DirectML placement."""
    model = ir.from_proto(conv_leaky_model(batch=1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench, "compare", _half_first)
        result = dmlopt.optimize(model, target="cpu", passes=["cleanup", "fp16"], tune=True, retime=True)
    r = result.report
    try:
        from dmlopt.targets.dml import placement
    except ImportError:
        placement = None
    if placement is not None:
        r.placement = {"before": placement.predict(model, ort_version="1.14").to_dict(),
                       "after": placement.predict(result.model, ort_version="1.14").to_dict()}
    r.passes[0]["sites"].append({"node": "<script>alert(1)</script>", "op": "Conv", "action": "declined",
                                 "detail": "a & b < c"})
    return r


class Page(html.parser.HTMLParser):
    """Tables by id with their body rows, tags seen, and every attribute that could load something."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.tags: list[str] = []
        self.loads: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        self.loads += [f"{tag} {k}={v}" for k, v in attrs.items() if k in ("src", "href", "srcset", "data")]
        if tag == "table":
            self._table = attrs.get("id") or f"table{len(self.tables)}"
            self.tables[self._table] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    return page


def test_page_has_the_tables_and_charts(rep):
    text = html_report.render(rep)
    page = parse(text)
    assert [row[0] for row in page.tables["passes"]] == ["cleanup", "fp16"]
    ops = {row[0]: row[1:3] for row in page.tables["ops"]}
    assert ops["Conv"] == [str(rep.input["op_counts"]["Conv"]), str(rep.output["op_counts"]["Conv"])]
    assert [row[0] for row in page.tables["validation"]] == ["y"]
    assert [row[0] for row in page.tables["timing"]] == ["before", "after"]
    choice = page.tables["choice-fp16-fp16"]
    assert {row[0] for row in choice} == {"False", "True"}
    assert [row[-1] for row in choice].count("chosen") == 1
    if rep.placement:
        assert page.tables["placement"][3][0] == "on CPU"
    assert page.tags.count("svg") == 4  # latency, op histogram, fp16 candidates, the final comparison
    assert "numerics match" in text


def test_page_is_self_contained_and_escapes_text(rep):
    text = html_report.render(rep)
    page = parse(text)
    assert page.loads == []
    for tag in ("script", "link", "img", "iframe", "object"):
        assert tag not in page.tags
    assert "url(" not in text and "@import" not in text
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "a &amp; b &lt; c" in text


def test_report_write_picks_html_by_extension(rep, tmp_path):
    path = tmp_path / "r.html"
    report.write(rep, path)
    assert path.read_text(encoding="utf-8") == html_report.render(rep)


def test_a_report_without_timing_or_validation_still_renders():
    model = ir.from_proto(conv_leaky_model(batch=1))
    r = dmlopt.optimize(model, target="dml", passes=["cleanup"], validate=False).report
    page = parse(html_report.render(r))
    assert "timing" not in page.tables and "validation" not in page.tables
    assert [row[0] for row in page.tables["passes"]] == ["cleanup"]


# -- in a browser --------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def png_pixels(path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) to an HxWxC array."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0
    channels = 4 if color == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if kind == 0:
            cur = line
        elif kind == 2:
            cur = (line + prev) & 0xFF
        else:  # Sub, Average, Paeth depend on the pixel to the left: decode sequentially
            cur = np.zeros(stride, np.int32)
            for x in range(stride):
                a = cur[x - channels] if x >= channels else 0
                b, c = prev[x], (prev[x - channels] if x >= channels else 0)
                if kind == 1:
                    pred = a
                elif kind == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (line[x] + pred) & 0xFF
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)[:, :, :3]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_page_renders_in_headless_chromium(rep, tmp_path):
    page = tmp_path / "report.html"
    report.write(rep, page)
    shot = tmp_path / "shot.png"
    run = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri())
    assert shot.is_file(), run.stderr[-2000:]
    pixels = png_pixels(shot)
    assert pixels.shape[:2] == (1600, 1200)
    background = np.array([0xF6, 0xF8, 0xFB])
    ink = np.any(np.abs(pixels.astype(int) - background) > 24, axis=2)
    assert ink.mean() > 0.03  # text, cards, tables and bars: not a blank page
    colors = {tuple(c) for c in pixels[::7, ::7].reshape(-1, 3)}
    assert len(colors) > 50
    blue = np.all(np.abs(pixels.astype(int) - AFTER_BLUE) <= 3, axis=2)
    assert blue.sum() > 500  # the charts' "after" bars were drawn
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    for marker in ('id="passes"', 'id="ops"', 'id="validation"', 'id="timing"', "<svg", 'id="op-chart"'):
        assert marker in dom.stdout, marker
    if os.environ.get("DMLOPT_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["DMLOPT_KEEP_SCREENSHOT"])
