"""window-layout: windowed blocks built by hand in several spellings, the bundled SAM, numerics on ORT CPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes.transpose import transpose_count
from dmlopt.passes.window_layout import Window, WindowLayoutPass, find_sites
from dmlopt.engine.pipeline import check_model, op_counts
from dmlopt.runtime.validate import run
from models.onnx_builder import Graph
from models.windowed import mix_tokens, partition, unpartition, windowed_model


def optimize(proto: onnx.ModelProto, **options):
    model = ir.from_proto(proto)
    p = WindowLayoutPass(PassContext(target="dml", options={"window_layout": "merge", **options}))
    result = p(model.clone())
    check_model(result.model, "window-layout")
    return model, result, p


def assert_same(model: ir.Model, out: ir.Model, shape, seed=0):
    feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    expected, got = run(model, feeds), run(out, feeds)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5, err_msg=name)


# ** sites (case 1) **

@pytest.mark.parametrize("spelling", ["sam", "einops"])
def test_both_spellings_are_found_with_their_geometry(spelling):
    model = ir.from_proto(windowed_model(h=8, w=9, ws=5, spelling=spelling))
    ir.passes.common.ShapeInferencePass()(model)
    partitions, merges = find_sites(model.graph, 17)
    assert len(partitions) == 2 and len(merges) == 2
    assert {s.window for s in partitions + merges} == {Window(1, 8, 9, 10, 10, 5, 5)}


def test_mask_marks_the_padded_tokens_in_window_order():
    window = Window(1, 3, 4, 4, 4, 2, 2)
    mask = window.mask()
    assert mask.shape == (4, 2, 2, 1)
    natural = np.zeros((1, 4, 4, 1), bool)
    natural[:, :3, :4] = True
    np.testing.assert_array_equal(mask[:, :, :, 0], natural.reshape(1, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4)
                                  .reshape(4, 2, 2))
    assert mask.sum() == 12


# ** the rewrite (cases 2-4) **

@pytest.mark.parametrize("spelling", ["sam", "einops"])
@pytest.mark.parametrize("h,w,ws", [(8, 8, 5), (8, 8, 4), (7, 9, 3), (6, 10, 5)])
def test_windowed_pair_keeps_window_layout_between_blocks(spelling, h, w, ws):
    proto = windowed_model(h=h, w=w, ws=ws, spelling=spelling)
    model, result, p = optimize(proto)
    assert result.modified
    assert transpose_count(model) == 5 and transpose_count(result.model) == 3  # 4 window + neck -> 2 + neck
    padded = (h % ws, w % ws) != (0, 0)
    counts = op_counts(result.model)
    assert counts.get("Pad", 0) == (1 if padded else 0) and counts.get("Slice", 0) == (1 if padded else 0)
    assert counts.get("Where", 0) == (2 if padded else 0)  # Pad's zeros back before each partition's reader
    assert_same(model, result.model, [1, h, w, 6])
    assert any("conversions 4 -> 2" in n for n in p.notes)


def test_three_windowed_blocks_save_four_transposes_and_batch_above_one():
    proto = windowed_model(b=2, blocks="www", h=6, w=7, ws=4)
    model, result, _ = optimize(proto)
    assert transpose_count(model) == 7 and transpose_count(result.model) == 3
    assert_same(model, result.model, [2, 6, 7, 6])


def test_global_block_between_windowed_ones_stays_natural():
    """SAM ViT-B's order (w w g w w): each windowed pair merges, the global block reads natural tokens."""
    proto = windowed_model(blocks="wwgww")
    model, result, _ = optimize(proto)
    assert transpose_count(model) == 9 and transpose_count(result.model) == 5
    assert_same(model, result.model, [1, 8, 8, 6])


def test_two_window_sizes_over_the_same_tokens_merge_each_pair():
    """Geometries are solved one at a time, sites found again after each rewrite."""
    proto = windowed_model(blocks="wwww", ws=(4, 4, 3, 3), h=7, w=9)
    model, result, p = optimize(proto)
    assert transpose_count(model) == 9 and transpose_count(result.model) == 5
    assert sum("conversions 4 -> 2" in n for n in p.notes) == 2
    assert_same(model, result.model, [1, 7, 9, 6])


def test_opset11_layernorm_decomposition_is_per_token():
    proto = windowed_model(decomposed_norm=True, opset=13)
    model, result, _ = optimize(proto)
    assert transpose_count(result.model) == 3
    assert_same(model, result.model, [1, 8, 8, 6])


def test_single_windowed_block_is_kept_with_a_reason():
    proto = windowed_model(blocks="w")
    model, result, p = optimize(proto)
    assert not result.modified
    assert transpose_count(result.model) == transpose_count(model)
    assert any(s.action == "kept" and "would not save" in s.detail for s in p.sites)


def test_an_op_that_mixes_tokens_between_the_blocks_reads_a_merged_copy():
    """x + mean over all tokens between two windowed blocks: the mean reads x through one new U,
    the Add (x plus a per-channel value) stays windowed: 4 conversions -> 3."""
    proto = windowed_model(between="token-mix")
    model, result, p = optimize(proto)
    assert result.modified and any("conversions 4 -> 3" in n for n in p.notes)
    assert transpose_count(result.model) == transpose_count(model) - 1
    assert_same(model, result.model, [1, 8, 8, 6])


def test_a_position_dependent_constant_between_the_blocks_is_partitioned_too():
    """A (1, H, W, C) constant added to the tokens (a positional embedding) is a natural-layout
    input of a per-token Add: one more conversion, of a constant, and still fewer than the sites."""
    proto = windowed_model(between="position")
    model, result, p = optimize(proto)
    assert result.modified and any("conversions 4 -> 3" in n for n in p.notes)
    assert_same(model, result.model, [1, 8, 8, 6])


def test_a_graph_output_between_the_blocks_keeps_them_apart():
    """Case 5: a graph output stays natural, so each windowed block is alone: nothing to save."""
    proto = windowed_model(between="output")
    model, result, p = optimize(proto)
    assert not result.modified and transpose_count(result.model) == transpose_count(model)
    assert [v.shape.dims for v in result.model.graph.outputs] == [(1, 6, 8, 8), (1, 8, 8, 6)]
    assert any(s.action == "kept" and "would not save" in s.detail for s in p.sites)


def test_token_mixing_op_between_blocks_stops_the_region():
    """A Conv over the merged tokens between the blocks cannot move."""
    g = Graph(1)
    b, h, w, c, ws = 1, 8, 8, 4, 5
    p, padded = partition(g, "x", b, h, w, c, ws, "sam")
    a = unpartition(g, mix_tokens(g, p, c), b, h, w, c, ws, padded, "sam")
    a = g("Conv", g("Transpose", a, perm=[0, 3, 1, 2]), g.weight(c, c, 3, 3), pads=[1, 1, 1, 1])
    a = g("Transpose", a, perm=[0, 2, 3, 1])
    p2, _ = partition(g, a, b, h, w, c, ws, "sam")
    out = unpartition(g, mix_tokens(g, p2, c), b, h, w, c, ws, padded, "sam")
    proto = g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, h, w, c])], out,
                    shape=[b, h, w, c])
    model, result, _ = optimize(proto)
    assert not result.modified and transpose_count(result.model) == transpose_count(model)


def test_graph_output_in_the_region_stays_natural():
    proto = windowed_model(tail="none")  # the last block's output is the graph output
    model, result, _ = optimize(proto)
    assert transpose_count(result.model) == 2  # one P in, one U out for the graph output
    assert [v.shape.dims for v in result.model.graph.outputs] == [(1, 8, 8, 6)]
    assert_same(model, result.model, [1, 8, 8, 6])


def test_keep_leaves_the_model_alone():
    proto = windowed_model()
    model, result, _ = optimize(proto, window_layout="keep")
    assert not result.modified and transpose_count(result.model) == transpose_count(model)


# ** the bundled SAM, through the pipeline **

@pytest.mark.parametrize("ort_version", [None, "1.18", "1.14"])
def test_bundled_sam_for_directml_keeps_at_most_half_the_exports_transposes(ort_version):
    """Issue 5's bar, with the defaults: no Einsum, at most half the Transposes, same numerics.
    Before ORT 1.15 DirectML has no MultiHeadAttention: each block keeps its head-split pair."""
    from dmlopt.cli.demo import bundled_path
    model = dmlopt.load(bundled_path("sam_small.onnx"))
    result = dmlopt.optimize(model, target="dml", ort_version=ort_version, retime=False)
    before, after = result.report.input["op_counts"], result.report.output["op_counts"]
    assert result.passed
    assert after.get("Einsum", 0) == 0 and before["Einsum"] == 6
    bound = before["Transpose"] // 2 if ort_version != "1.14" else before["Transpose"] * 2 // 3
    assert after["Transpose"] <= bound, (before["Transpose"], after["Transpose"])
    window = next(p for p in result.report.to_dict()["passes"] if p["name"] == "window-layout")
    assert window["op_counts_after"]["Transpose"] == window["op_counts_before"]["Transpose"] - 2


def test_a_partition_that_moves_no_data_is_not_a_site():
    """One window column (nw = 1): the partition is a plain Reshape; and with one channel the
    neck's NHWC -> NCHW Transpose has a window partition's element order too.  Neither is a site
    (found by the property test: the neck was taken for a partition)."""
    model = ir.from_proto(windowed_model(h=4, w=2, c=1, ws=2, spelling="einops", opset=13, decomposed_norm=True))
    ir.passes.common.ShapeInferencePass()(model)
    assert find_sites(model.graph, 13) == ([], [])
    model, result, _ = optimize(windowed_model(h=4, w=2, c=1, ws=2, spelling="einops", opset=13,
                                               decomposed_norm=True))
    assert not result.modified


def test_two_window_readers_of_one_value_both_get_the_masked_windows():
    """Two attentions partition the same LayerNorm output: both partitions are replaced."""
    g = Graph(3)
    b, h, w, c, ws = 1, 7, 7, 4, 4
    x = "x"
    for _ in range(2):
        n = g("LayerNormalization", x, g.weight(c), g.weight(c), axis=-1)
        branches = []
        for _ in range(2):
            p, padded = partition(g, n, b, h, w, c, ws)
            branches.append(unpartition(g, mix_tokens(g, p, c), b, h, w, c, ws, padded))
        x = g("Add", g("Add", x, branches[0]), branches[1])
    x = g("Relu", x)  # the output's producer reads one merged value (an Add of two would need two)
    proto = g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, h, w, c])], x, shape=[b, h, w, c])
    model, result, _ = optimize(proto)
    assert transpose_count(model) == 8 and transpose_count(result.model) == 2
    assert_same(model, result.model, [b, h, w, c])


def test_dynamo_export_merges_its_windowed_pair_too(tmp_path):
    """torch's dynamo exporter (opset 18, its own spelling of the partitions), dynamic batch frozen."""
    sam_encoder = pytest.importorskip("models.sam_encoder")
    model = dmlopt.load(sam_encoder.export_dynamo(tmp_path / "sam_dynamo.onnx", dynamic_batch=True))
    result = dmlopt.optimize(model, target="dml", dims={"batch": 1}, retime=False)
    assert result.passed
    window = next(p for p in result.report.to_dict()["passes"] if p["name"] == "window-layout")
    assert window["op_counts_after"]["Transpose"] == window["op_counts_before"]["Transpose"] - 2
    assert window["op_counts_after"].get("Where", 0) == 2


def test_bundled_sam_in_float16_keeps_the_masked_windows_valid():
    """The fp16 pass after window-layout converts the Where's zero with the rest."""
    from dmlopt.cli.demo import bundled_path
    result = dmlopt.optimize(dmlopt.load(bundled_path("sam_small.onnx")), target="dml", fp16=True, retime=False)
    assert result.passed
    counts = result.report.output["op_counts"]
    assert counts["Where"] == 2 and counts["Transpose"] <= 8


@pytest.mark.skipif(dmlopt.runtime.sessions.has_target("cuda"), reason="the CUDA provider is here: auto would be timed")
@pytest.mark.parametrize("fp16, expected", [(False, "merge"), (True, "keep")])
def test_cuda_default_follows_the_precision_written(fp16, expected):
    """--target cuda without timing: merged in float32, kept in float16 (the padded tokens' MLP work)."""
    from dmlopt.cli.demo import bundled_path
    model = dmlopt.load(bundled_path("sam_small.onnx"))
    result = dmlopt.optimize(model, target="cuda", fp16=fp16, retime=False)
    assert result.passed
    (record,) = [c for c in result.report.choices if c["option"] == "window_layout"]
    assert record["choice"] == expected and "measured on an H200" in record["default_from"]
    window = next(p for p in result.report.to_dict()["passes"] if p["name"] == "window-layout")
    assert window["modified"] == (expected == "merge")
