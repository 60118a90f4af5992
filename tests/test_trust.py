"""Numbers a user can trust (issue 22): real shapes, the same inputs, no noise, the verdict first."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.graph import input_sizes
from dmlopt.report import html_page as html_report
from dmlopt.runtime import bench, sessions as runtime
from dmlopt.errors import InputError
from tests import shape_models
from tests.conftest import conv_leaky_model


def _save(tmp_path, proto, name):
    path = tmp_path / name
    onnx.save(proto, path)
    return str(path)


# -- item 1: dynamic dims get sizes that exercise the model ----------------------------------------

def test_unet_spatial_dims_are_a_multiple_of_its_stride_not_one():
    model = ir.from_proto(shape_models.unet())
    shape = runtime.input_specs(model)["image"][0]
    assert shape[0] == 1 and shape[1] == 3
    assert shape[2] == shape[3] >= 32 and shape[2] % input_sizes.total_stride(model) == 0
    assert input_sizes.total_stride(model) == 4  # two 2x2 pools


def test_super_resolution_unnamed_dims_get_a_real_image(cli, tmp_path):
    path = _save(tmp_path, shape_models.super_resolution(), "sr.onnx")
    r = cli("validate", path, path, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["inputs"]["lr"] == [1, 3, 32, 32]
    assert data["outputs"][0]["shape"] == [1, 3, 64, 64]  # DepthToSpace x2 of a 32x32 image, not 1x1
    assert any("image dims: the smallest multiple of the total stride 1 from 32" in b for b in data["input_basis"])


def test_patch_vit_gets_the_size_its_position_table_implies(cli, tmp_path):
    """16x16 patches and a static table of 196 positions: only 224x224 runs (1x1 failed in ORT)."""
    path = _save(tmp_path, shape_models.patch_vit(image=224), "vit.onnx")
    r = cli("validate", path, path)
    assert r.code == 0, r.err
    assert "pixels 1x3x224x224" in r.out.splitlines()[0]  # the verdict line names the shapes used
    r = cli("bench", path, "--ep", "cpu", "--runs", 1, "--warmup", 0)
    assert r.code == 0, r.err
    assert "inputs: pixels 1x3x224x224" in r.out


def test_a_dim_nothing_sizes_is_refused_naming_it_and_the_flag(cli, tmp_path):
    path = _save(tmp_path, shape_models.token_model(), "tok.onnx")
    for args in (("validate", path, path), ("bench", path, "--ep", "cpu"),
                 ("optimize", path, "-o", tmp_path / "o.onnx")):
        r = cli(*args)
        assert r.code == 2, (args, r.out)
        assert "'seq' (x[1])" in r.err and "--dim seq=N" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "o.onnx").exists()
    r = cli("validate", path, path, "--dim", "seq=5")
    assert r.code == 0 and "x 1x5x8" in r.out


def test_example_sizes_from_metadata_and_dim_names():
    model = ir.from_proto(shape_models.token_model())
    model.metadata_props["seq"] = "12"
    assert runtime.input_specs(model)["x"][0] == [1, 12, 8]
    model = ir.from_proto(shape_models.token_model())
    model.graph.inputs[0].shape = ir.Shape(["batch", "seq_77", 8])
    assert runtime.input_specs(model)["x"][0] == [1, 77, 8]


def test_the_user_sizes_win():
    model = ir.from_proto(shape_models.unet())
    assert runtime.input_specs(model, dims={"height": 48, "width": 40})["image"][0] == [1, 3, 48, 40]
    assert runtime.input_specs(model, {"image": [2, 3, 16, 16]})["image"][0] == [2, 3, 16, 16]


def test_a_static_dim_the_graph_fixes_is_found():
    """A sequence added to a static table of 10 positions: 10 is the only size that fits."""
    model = ir.from_onnx_text('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, seq, 4] x, float[1, 10, 4] pos) => (float[batch, seq, 4] y) { y = Add(x, pos) }''')
    pos = model.graph.inputs.pop()
    pos.const_value = ir.tensor(np.zeros((1, 10, 4), np.float32))
    model.graph.register_initializer(pos)
    assert runtime.input_specs(model)["x"][0] == [1, 10, 4]


def test_optimize_refuses_free_dims_before_any_pass(tmp_path):
    with pytest.raises(InputError, match="seq"):
        dmlopt.optimize(ir.from_proto(shape_models.token_model()), target="cpu")


# -- item 2: bench --compare runs both models on the same inputs -------------------------------------

def test_compare_a_shape_fixed_model_with_its_dynamic_original_on_the_fixed_shapes(cli, tmp_path):
    dynamic = shape_models.unet()
    fixed = shape_models.unet()
    dims = fixed.graph.input[0].type.tensor_type.shape.dim
    for d, v in zip(dims, (1, 3, 64, 48)):
        d.Clear()
        d.dim_value = v
    a, b = _save(tmp_path, dynamic, "unet.onnx"), _save(tmp_path, fixed, "unet.fixed.onnx")
    r = cli("bench", a, "--compare", b, "--ep", "cpu", "--runs", 3, "--warmup", 1, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["inputs"] == {"image": [1, 3, 64, 48]} and set(data["models"]) == {"unet.onnx", "unet.fixed.onnx"}
    for d, v in zip(dims, (1, 3, 32, 32)):
        d.Clear()
        d.dim_value = v
    c = _save(tmp_path, fixed, "unet.other.onnx")
    r = cli("bench", b, "--compare", c, "--ep", "cpu")
    assert r.code == 2 and "cannot run the same inputs" in r.err


# -- item 3: no noise ---------------------------------------------------------------------------------

def test_a_ratio_inside_the_noise_is_no_measurable_difference():
    noisy = bench.ratio_summary([0.9, 1.1, 0.95, 1.05, 1.0])
    assert noisy["verdict"] == "no measurable difference" and noisy["runs"] == 5
    assert bench.ratio_text(noisy).startswith("no measurable difference (time ratio 1.000, p10-p90")
    faster = bench.ratio_summary([0.5, 0.52, 0.48, 0.5, 0.5])
    assert faster["verdict"] == "faster" and bench.ratio_text(faster).startswith("x2.00 faster")
    assert bench.ratio_summary([1.5, 1.6, 1.4])["verdict"] == "slower"


def test_an_unchanged_graph_is_reported_identical_not_timed(tmp_path):
    path = _save(tmp_path, conv_leaky_model(), "m.onnx")
    result = dmlopt.optimize(path, target="cpu", passes="prelu", dims={"N": 1})
    assert not any(p["modified"] for p in result.report.passes)
    assert result.report.timing["identical"] is True and "before_ms" not in result.report.timing
    assert "timing: identical graph" in result.report.to_table()


# -- item 6/7: the verdict first, said once -----------------------------------------------------------

def test_report_opens_with_the_verdict(tmp_path):
    path = _save(tmp_path, shape_models.unet(), "unet.onnx")
    rep = dmlopt.optimize(path, target="dml", retime=False).report
    lines = rep.to_table().splitlines()
    assert lines[0].startswith("DirectML (ORT ") and "CPU nodes" in lines[0] and "copies" in lines[0]
    assert lines[1].startswith("numerics (ORT CPU EP): match") and "image 1x3x32x32" in lines[1]
    # no DirectML host in the default test run: the real EP's line says why it did not run
    assert lines[2].startswith("numerics (real DirectML EP): not run (")
    assert lines[3].startswith("timing: none (")
    data = rep.to_dict()
    assert list(data)[0] == "verdict" and data["verdict"] == lines[:4]
    # an option of a pass that changed nothing is not a sentence of its own
    assert sum("not timed" in line for line in lines) <= 1


def test_quiet_optimize_prints_only_the_verdict_and_the_paths(cli, tmp_path):
    path = _save(tmp_path, shape_models.unet(), "unet.onnx")
    out = tmp_path / "o.onnx"
    r = cli("optimize", path, "-o", out, "-q", "--target", "cpu", "--no-time")
    assert r.code == 0, r.err
    assert r.out.splitlines()[0].startswith("numerics") and len(r.out.splitlines()) <= 3
    assert f"wrote {out}" in r.err


# -- item 9 -------------------------------------------------------------------------------------------

def test_inputs_file_with_reference_outputs_is_accepted(cli, tmp_path):
    path = _save(tmp_path, conv_leaky_model(), "m.onnx")
    npz = tmp_path / "io.npz"
    np.savez(npz, x=np.ones((1, 3, 8, 8), np.float32), y=np.zeros((1, 4, 8, 8), np.float32))
    r = cli("validate", path, path, "--inputs", npz)
    assert r.code == 0, r.err
    np.savez(npz, y=np.zeros((1, 4, 8, 8), np.float32))
    r = cli("validate", path, path, "--inputs", npz)
    assert r.code == 2 and "y (an output)" in r.err


def test_pass_typo_suggests_the_name(cli, tmp_path):
    path = _save(tmp_path, conv_leaky_model(), "m.onnx")
    r = cli("optimize", path, "-o", tmp_path / "o.onnx", "--passes", "leaky-rleu")
    assert r.code == 2 and "did you mean 'leaky-relu'" in r.err


def test_inspect_counts_attention_and_conv_transpose(cli, tmp_path):
    model = ir.from_onnx_text('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4, 8] q, float[1, 8, 4] k, float[1, 4, 8] v, float[1, 2, 4, 4] img, float[2, 3, 2, 2] w)
          => (float[1, 4, 8] o, float[1, 3, 8, 8] up) {
            s = MatMul(q, k)
            p = Softmax <axis = -1> (s)
            o = MatMul(p, v)
            up = ConvTranspose <strides = [2, 2]> (img, w)
        }''')
    path = tmp_path / "a.onnx"
    ir.save(model, path)
    r = cli("inspect", path)
    assert "attention (Softmax into MatMul, or fused): 1" in r.out and "ConvTranspose: 1 (strides 2x2)" in r.out


def test_html_opens_with_the_verdict_and_charts_what_changed_in_kind():
    rep = {"verdict": ["numerics (ORT CPU EP): match on x 1x3x64x64"],
           "input": {"op_counts": {"Constant": 400, "Einsum": 24, "MatMul": 30, "Add": 50}},
           "output": {"op_counts": {"Constant": 100, "com.microsoft.MultiHeadAttention": 12, "MatMul": 28, "Add": 50}},
           "timing": {"provider": "CPUExecutionProvider", "identical": True, "verdict": "identical graph"}}
    page = html_report.render(rep)
    assert page.index('id="verdict"') < page.index('id="summary"')
    chart = page[page.index('id="op-chart"'):page.index("</svg>", page.index('id="op-chart"'))]
    labels = [line.split(">")[-1] for line in chart.split("</text>") if 'text-anchor="end"' in line]
    assert set(labels[:2]) == {"com.microsoft.MultiHeadAttention", "Einsum"}  # in full, not clipped
    assert "Constant" not in labels and "Add" not in labels


def test_inspect_says_which_shapes_validation_would_use(cli, tmp_path):
    r = cli("inspect", _save(tmp_path, shape_models.unet(), "unet.onnx"))
    assert "validated and timed by default on: image 1x3x32x32" in r.out
    r = cli("inspect", _save(tmp_path, shape_models.token_model(), "tok.onnx"), "--json")
    assert "--dim seq=N" in json.loads(r.out)["validation_inputs"]["refused"]


def test_a_dml_model_timed_on_the_cpu_says_it_does_not_represent_directml(cli, tmp_path):
    path = _save(tmp_path, conv_leaky_model(), "m.onnx")
    out = tmp_path / "m.dml.onnx"
    assert cli("optimize", path, "-o", out, "-q", "--dim", "N=1").code == 0
    r = cli("bench", out, "--ep", "cpu", "--runs", 1, "--warmup", 0)
    assert r.code == 0, r.err
    assert "does not represent DmlExecutionProvider" in r.out
    r = cli("bench", path, "--ep", "cpu", "--runs", 1, "--warmup", 0)
    assert "does not represent" not in r.out


def test_the_timing_line_names_the_shapes_timed_and_its_spread(tmp_path):
    path = _save(tmp_path, conv_leaky_model(), "m.onnx")
    rep = dmlopt.optimize(path, target="cpu", passes="cleanup").report  # drops the Identity: a changed graph
    line = next(x for x in rep.verdict() if x.startswith("timing"))
    assert "with x 1x3x8x8" in line and "alternating pairs" in line and "p10-p90" in line


def test_session_leaves_free_the_sizes_dmlopt_chose_to_validate_with():
    """Issue 31: pinned at 32x32, the session refused the user's 640x640 image."""
    rep = dmlopt.optimize(ir.from_proto(shape_models.unet()), target="dml").report
    cfg = rep.session_config["config"]
    assert cfg["free_dimension_overrides"] == {}
    assert {f"free_dimension_overrides.{d}" for d in ("batch", "height", "width")} <= set(cfg["not_set"])
    assert rep.validation["inputs"] == {"image": [1, 3, 32, 32]}


def test_an_nhwc_image_transposed_to_nchw_gets_image_sizes():
    model = ir.from_onnx_text('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, h, w, 3] x, float[4, 3, 2, 2] k) => (float[batch, 4, hh, ww] y) {
            t = Transpose <perm = [0, 3, 1, 2]> (x)
            y = Conv <strides = [2, 2]> (t, k)
        }''')
    k = model.graph.inputs.pop()
    k.const_value = ir.tensor(np.ones((4, 3, 2, 2), np.float32))
    model.graph.register_initializer(k)
    assert runtime.input_specs(model)["x"][0] == [1, 32, 32, 3]


def test_a_rewrite_right_only_at_one_pixel_is_caught(cli, tmp_path):
    """Validated at 1x1 (as before), a model that averages the image and broadcasts it back matched one
    that keeps every pixel; at the sizes dmlopt now chooses it does not."""
    head = '''<ir_version: 8, opset_import: ["" : 17]>
        g (float[batch, 3, h, w] x, float[4, 3, 1, 1] k) => (float[batch, 4, h, w] y) {'''
    ref = ir.from_onnx_text(head + "y = Conv(x, k) }")
    cand = ir.from_onnx_text(head + '''
            m = GlobalAveragePool(x)
            s = Shape(x)
            e = Expand(m, s)
            y = Conv(e, k) }''')
    for model in (ref, cand):
        k = model.graph.inputs.pop()
        k.const_value = ir.tensor(np.ones((4, 3, 1, 1), np.float32))
        model.graph.register_initializer(k)
    paths = [tmp_path / "ref.onnx", tmp_path / "cand.onnx"]
    for model, path in zip((ref, cand), paths):
        ir.save(model, path)
    assert cli("validate", *paths, "--dim", "h=1", "--dim", "w=1").code == 0  # what validation did before
    r = cli("validate", *paths)
    assert r.code == 1 and "numerics: DIFFER on x 1x3x32x32" in r.out


def test_tune_ep_names_no_best_inside_the_noise():
    def result(ratios):
        models = {"a=1": {"ratios": [1.0] * 5}, "a=0": {"ratios": ratios}}
        return {"models": models, "best": "a=0", "baseline": "a=1", "flags": "--provider-option a=0"}
    assert bench._best_line(result([0.9, 1.1, 0.95, 1.02, 0.97])).startswith(
        "best: no option set is measurably faster than a=1 (fastest median: a=0, no measurable difference")
    assert bench._best_line(result([0.5, 0.52, 0.48, 0.5, 0.5])) == "best: a=0  (--provider-option a=0)"


def test_bench_compare_of_identical_files_times_nothing(cli, tmp_path):
    a, b = _save(tmp_path, conv_leaky_model(), "a.onnx"), _save(tmp_path, conv_leaky_model(), "b.onnx")
    r = cli("bench", a, "--compare", b, "--ep", "cpu")
    assert r.code == 0 and r.out.startswith("identical models:") and "ratio" not in r.out


# -- issue 31 item 2: image sizes that are right, within a budget, said before the work -----------

def test_total_stride_is_the_product_along_a_path_not_over_every_branch():
    """A Segformer's spatial-reduction Convs made later stages look coarser (2048 on the real one),
    Depth Anything's patch-14 with an x4 upsampling branch gave 84."""
    assert input_sizes.total_stride(ir.from_proto(shape_models.segformer())) == 32
    assert input_sizes.total_stride(ir.from_proto(shape_models.dpt_head())) == 28
    v = dmlopt.validate(shape_models.segformer(), shape_models.segformer())
    assert v.passed and v.inputs == {"image": [1, 3, 32, 32]}


def _position_table_model(table: int, patch: int = 16) -> onnx.ModelProto:
    """A patch embedding added to a static table of table x table positions: only H = W =
    table * patch fits the graph."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, patch, patch)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros((1, 8, table, table), np.float32), "pos")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["t"], strides=[patch, patch]),
             helper.make_node("Add", ["t", "pos"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                         [1, 3, "height", "width"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_image_sizes_are_capped_and_within_a_memory_budget(monkeypatch):
    """dmlopt sizes image dims itself up to 1024 px and 1 GiB of estimated activations; beyond, one
    line naming the size it would need and the --dim to give."""
    fits = input_sizes.choose(ir.from_proto(_position_table_model(32)))  # 512 px: under the cap
    assert fits.shapes == {"image": [1, 3, 512, 512]}
    with pytest.raises(input_sizes.FreeDims, match=r"up to 1024 px.*--dim height=N --dim width=N"):
        input_sizes.choose(ir.from_proto(_position_table_model(128)))  # only 2048 px fits
    peak = input_sizes.activation_peak(
        onnx.shape_inference.infer_shapes(_sized(shape_models.segformer(), 512)), ["image"])
    assert 16 << 20 <= peak < 64 << 20  # the 16 MiB score matrix of stage 1 at 512 px, and little more
    monkeypatch.setattr(input_sizes, "MEMORY_BUDGET", 2 << 20)
    with pytest.raises(input_sizes.FreeDims, match=r"512, needs ~\d+ MiB of activations \(estimated\), over the 2 MiB"):
        input_sizes.choose(ir.from_proto(_position_table_model(32)))


def _sized(proto: onnx.ModelProto, size: int) -> onnx.ModelProto:
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, (1, 3, size, size)):
        dim.Clear()
        dim.dim_value = value
    return proto


def test_the_sizes_are_said_before_the_models_run():
    said = []

    def progress(step):
        said.append(step)

    v = dmlopt.validate(shape_models.unet(), shape_models.unet(), progress=progress)
    assert v.passed and said == ["validate on image 1x3x32x32 (batch=1 (axis 0, the batch); height,width=32 "
                                 "(image dims: the smallest multiple of the total stride 4 from 32 that fits the "
                                 "graph's static shapes))"]


# -- issue 31 item 5: messages that say what happened ----------------------------------------------

def test_an_input_model_without_finite_outputs_is_said_so_and_no_pass_is_blamed(cli, tmp_path):
    """It was "does not match the original (first failing pass: cleanup)"."""
    path = _save(tmp_path, onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8] x) => (float[1, 8] y) {
            a = Abs(x)
            n = Neg(a)
            m1 = Constant <value = float[1] {1.0}> ()
            s = Sub(n, m1)
            r = Sqrt(s)
            y = Identity(r)
        }'''), "nan.onnx")
    r = cli("optimize", path, "-o", tmp_path / "out.onnx", "--target", "cpu")
    assert r.code == 1 and not (tmp_path / "out.onnx").exists()
    assert "the input model computes no finite values on these inputs (output 'y' all NaN/inf)" in r.err
    assert "first failing pass" not in r.err + r.out and "not comparable" in r.out
    rep = dmlopt.optimize(path, target="cpu", retime=False).report
    assert rep.broken_by is None and rep.validation["reference_nonfinite"] == ["y"]


def test_validate_names_the_inputs_two_models_do_not_share(cli, tmp_path):
    """It was ORT's "missing from input feed"."""
    ref = _save(tmp_path, conv_leaky_model(), "ref.onnx")
    other = conv_leaky_model()
    other.graph.input[0].name = "image"
    for node in other.graph.node:
        node.input[:] = ["image" if i == "x" else i for i in node.input]
    cand = _save(tmp_path, other, "cand.onnx")
    r = cli("validate", ref, cand)
    assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1
    assert "CAND takes inputs REF does not: 'image' (REF takes 'x')" in r.err and "input feed" not in r.err


def test_inspect_says_onnx_runtime_cannot_load_an_op_no_runtime_implements(cli, tmp_path):
    """It called the node a DirectML fallback and never said ORT cannot load the model."""
    path = _save(tmp_path, onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17, "custom.x" : 1]>
        g (float[1, 8] x) => (float[1, 8] y) {
            a = Relu(x)
            y = custom.x.Frobnicate(a)
        }'''), "custom.onnx")
    r = cli("inspect", path, "--ep", "dml")
    assert r.code == 0  # described (a custom-op library may register it where it is deployed), and said first:
    first = r.out.splitlines()[0]
    assert first.startswith("ONNX Runtime ") and "cannot load this model (not a DirectML fallback" in first
    assert first.endswith("custom.x:Frobnicate(-1) is not a registered function/op")  # ORT's sentence whole
    assert json.loads(cli("inspect", path, "--json").out)["ort_cannot_load"]
    assert json.loads(cli("inspect", _save(tmp_path, conv_leaky_model(), "ok.onnx"), "--json").out)[
        "ort_cannot_load"] is None


# -- issue 31 item 6: validation values that fit how the graph uses an input -----------------------

def test_inputs_used_as_sizes_indices_and_divisors_get_values_that_fit(cli, tmp_path):
    """Random 0/1 integers made ONNX Runtime fail ("ONNX Runtime failed to run the model")."""
    path = _save(tmp_path, onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3, 4] x, int64[3] shape, int64[1] start, int64[1] d, int64[1] k) => (float[a, b, c] y,
           int64[1] q, float[e] z) {
            y = Reshape(x, shape)
            t = Constant <value = int64[1] {7}> ()
            q = Div(t, d)
            f = Flatten <axis = 0> (x)
            f1 = Squeeze(f)
            z = Slice(f1, start, k)
        }'''), "roles.onnx")
    r = cli("validate", path, path)
    assert r.code == 0, r.err
    assert "shape: [0,0,-1] (a Reshape's shape, from the graph)" in r.out and "d: [" in r.out
    v = dmlopt.validate(path, path)
    assert v.passed and any("a Slice's ends" in b for b in v.basis)


def test_an_integer_input_the_graph_does_not_explain_is_named_with_the_way_out(cli, tmp_path):
    path = _save(tmp_path, onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[8] x, int64[2] parts) => (float[a] y, float[b] z) {
            y, z = Split <axis = 0> (x, parts)
        }'''), "split.onnx")
    r = cli("validate", path, path)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "'parts' got dmlopt's own random values 0/1" in r.err
    assert "--inputs FILE.npz" in r.err and "inputs= in the API" in r.err


def test_a_zero_sized_dim_given_as_the_model_declares_it_is_accepted(cli, tmp_path):
    path = _save(tmp_path, onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[0, 4] e, float[N, 4] x) => (float[M, 4] y) {
            y = Concat <axis = 0> (e, x)
        }'''), "zero.onnx")
    r = cli("validate", path, path, "--shape", "e:0,4", "--shape", "x:2,4")
    assert r.code == 0 and "e 0x4, x 2x4" in r.out, r.err
    assert dmlopt.validate(path, path, shapes={"e": [0, 4]}).passed
    refused = cli("validate", path, path, "--shape", "x:0,4")
    assert refused.code == 2 and "0 only where the model declares 0" in refused.err


def test_an_error_about_dmlopts_temporary_copy_names_the_users_file(cli, tmp_path):
    """A model with external data goes to ORT as a temporary copy; ORT's message named that copy."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "i"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64]),
                                    helper.make_tensor_value_info("i", TensorProto.INT64, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [w])
    path = tmp_path / "typed_wrong.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
              save_as_external_data=True, location="typed_wrong.onnx.data", size_threshold=0)
    r = cli("validate", path, path)
    line = r.err.strip()
    assert r.code == 2 and len(line.splitlines()) == 1
    assert f"{path} (through dmlopt's temporary copy)" in line and "dmlopt-ort-" not in line
    assert "random values" not in line  # a load failure, not the values' fault
