"""The DirectML placement model: one hand-written graph per rule, the data files, the SAM encoder."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.targets.dml import placement

DATA = pathlib.Path(dmlopt.__file__).parent / "data"


def model(text: str) -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(text))


def cpu_ops(p: placement.Placement) -> list[str]:
    return sorted(c["op"] for c in p.cpu_nodes)


def reasons(p: placement.Placement) -> dict[str, str]:
    return {c["node"]: c["reason"] for c in p.cpu_nodes}


# ** data files **

def test_data_files_cover_old_middle_and_newest_versions():
    assert placement.available_versions() == ["1.14", "1.17", "1.18", "1.19", "1.23", "1.24", "1.31"]
    for version in placement.available_versions():
        raw = json.loads((DATA / f"dml_ort_{version}.json").read_text())
        assert raw["ort_version"] == version
        for key, rows in raw["ops"].items():
            for row in rows:
                assert row["source"], key
                assert row["since"] == sorted(row["since"]), key
        for name, rule in raw["rules"].items():
            assert rule["source"], name


@pytest.mark.parametrize("asked, resolved", [
    (None, "1.31"), ("newest", "1.31"), ("1.14", "1.14"), ("1.14.1", "1.14"), ("1.16", "1.14"), ("1.17.3", "1.17"),
    ("1.18.1", "1.18"), ("1.20", "1.19"), ("1.28", "1.24"), ("1.30", "1.24"), ("1.10", "1.14"),
])
def test_version_resolution_picks_newest_file_not_newer_than_asked(asked, resolved):
    assert placement.resolve_version(asked) == resolved
    assert placement.load_data(asked).version == resolved


def test_registration_tables_differ_where_the_ep_changed():
    old, mid, new = (placement.load_data(v) for v in ("1.14", "1.18", "1.23"))
    assert not old.has_op("", "ReduceMean", 18) and mid.has_op("", "ReduceMean", 18)
    assert not mid.has_op("", "Reshape", 19) and new.has_op("", "Reshape", 19)
    assert not old.has_op("com.microsoft", "MultiHeadAttention") and mid.has_op("com.microsoft", "MultiHeadAttention")
    assert not any(d.has_op("", "Gelu") for d in (old, mid, new))
    assert all(d.has_op("com.microsoft", "Gelu") for d in (old, mid, new))


# ** kernel lookup **

def test_einsum_outside_the_pattern_table_runs_on_cpu_before_1_19_with_copies_each_way():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 5, 6, 8] x, float[5, 7, 8] k) => (float[2, 5, 6, 7] y) {
        a = Relu(x)
        e = Einsum <equation = "bhwc,hkc->bhwk"> (a, k)
        y = Relu(e)
    }""")
    old = placement.predict(m, ort_version="1.14")
    assert cpu_ops(old) == ["Einsum"]
    assert "recognized-equation table" in old.cpu_nodes[0]["reason"]
    # a: GPU -> CPU for the Einsum; e: CPU -> GPU for the Relu; k is a graph input read on the CPU only.
    assert [(e["value"], e["direction"]) for e in old.memcpy["edges"]] == [("a", "to_host"), ("e", "from_host")]
    assert old.memcpy["bytes"] == (2 * 5 * 6 * 8 + 2 * 5 * 6 * 7) * 4
    # Measured on 1.17.3 (the same graph as tests/test_calibrate.einsum_model): ORT knows only the rank of the
    # Einsum's output, so the Relu after it runs as a standalone kernel: one compiled partition (the first Relu).
    assert old.partitions["count"] == 1 and old.partitions["standalone_dml_kernels"] == 1
    assert not old.partitions["compiled"]
    assert placement.predict(m, ort_version="1.18").cpu_count == 1
    new = placement.predict(m, ort_version="1.23")
    assert new.cpu_count == 0 and new.copy_count == 0 and new.partitions["compiled"]


def test_einsum_matmul_form_runs_on_gpu_in_every_version():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3, 4, 5] a, float[3, 5, 6] b) => (float[3, 4, 6] y) {
        y = Einsum <equation = "bij,bjk->bik"> (a, b)
    }""")
    for version in ("1.14", "1.18", "1.23"):
        assert placement.predict(m, ort_version=version).cpu_count == 0


def test_onnx_gelu_20_has_no_kernel_but_com_microsoft_gelu_has():
    m = model("""
    <ir_version: 9, opset_import: ["" : 20, "com.microsoft" : 1]>
    g (float[2, 8] x) => (float[2, 8] y, float[2, 8] z) {
        a = Relu(x)
        y = Gelu(a)
        z = com.microsoft.Gelu(a)
    }""")
    assert "ai.onnx opset 20" in placement.predict(m, ort_version="1.14").warnings[0]  # 1.14 loads <= 18
    p = placement.predict(m, ort_version="1.23")
    assert p.warnings == []
    assert cpu_ops(p) == ["Gelu"]
    assert "ai.onnx Gelu" in p.cpu_nodes[0]["reason"]
    assert p.copy_count == 1  # a goes to the host once for the CPU Gelu


def test_since_version_must_be_registered_exactly():
    m = model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 8] x) => (float[2, 1] y) {
        a = Relu(x)
        axes = Constant <value = int64[1] {1}> ()
        y = ReduceMean <keepdims = 1> (a, axes)
    }""")
    old = placement.predict(m, ort_version="1.14")
    assert cpu_ops(old) == ["ReduceMean"]
    assert "ReduceMean-18" in old.cpu_nodes[0]["reason"]
    assert placement.predict(m, ort_version="1.18").cpu_count == 0


def test_version_gaps_name_the_version_each_op_needs(cli, tmp_path):
    m = model("""
    <ir_version: 9, opset_import: ["" : 20]>
    g (float[1, 2, 5, 6] x, float[1, 3, 4, 2] grid, float[2, 8] v) => (float[1, 2, 3, 4] y, float[2, 8] w) {
        y = GridSample <mode = "linear"> (x, grid)
        w = Gelu(v)
    }""")
    p = placement.predict(m, ort_version="1.23")
    assert p.to_dict()["version_gaps"] == [
        {"op": "Gelu", "version": 20, "registered": [], "nodes": 1, "function_body": True},
        {"op": "GridSample", "version": 20, "registered": [16], "nodes": 1, "function_body": False}]
    text = placement.summary_table(p.to_dict())
    assert "GridSample-20: DirectML registers 16 only (ORT 1.23; 1 node on the CPU)" in text
    assert "Gelu-20: DirectML registers no version of it" in text
    assert placement.predict(m, ort_version="1.14").version_gaps[1]["registered"] == []
    path = tmp_path / "gaps.onnx"
    onnx.save(ir.to_proto(m), path)
    r = cli("inspect", path, "--ep", "dml")
    assert r.code == 0 and "GridSample-20: DirectML registers 16 only" in r.out


def test_float64_and_types_the_kernel_does_not_register_go_to_cpu():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[4] y) {
        d = Cast <to = 11> (x)
        d2 = Add(d, d)
        y = Cast <to = 1> (d2)
    }""")
    p = placement.predict(m, ort_version="1.23")
    assert cpu_ops(p) == ["Add", "Cast", "Cast"]
    assert "no DirectML kernel for double" in reasons(p)["Add_1"]
    assert "double tensors are not supported" in reasons(p)["Cast_0"]


def test_rank_over_8_goes_to_cpu():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 1, 1, 1, 1, 1, 1, 1, 2] x) => (float[1, 1, 1, 1, 1, 1, 1, 1, 2] y) {
        y = Relu(x)
    }""")
    p = placement.predict(m, ort_version="1.23")
    assert cpu_ops(p) == ["Relu"] and "rank 9" in p.cpu_nodes[0]["reason"]


def test_layer_norm_rules_extra_outputs_and_missing_bias():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 8] x, float[8] s, float[8] b) => (float[2, 8] y, float[2, 8] z, float[2, 1] mean) {
        y = LayerNormalization(x, s)
        z, mean, inv = LayerNormalization(x, s, b)
    }""")
    old = placement.predict(m, ort_version="1.14")
    assert sorted(reasons(old).values()) == [
        "LayerNormalization with Mean/InvStdDev outputs runs on the CPU",
        "LayerNormalization without a bias input runs on the CPU in ORT 1.14"]
    new = placement.predict(m, ort_version="1.23")
    assert list(reasons(new).values()) == ["LayerNormalization with Mean/InvStdDev outputs runs on the CPU"]


def test_resize_cubic_goes_to_cpu_linear_stays():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 1, 4, 4] x) => (float[1, 1, 8, 8] y) {
        scales = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
        y = Resize <mode = "MODE"> (x, , scales)
    }"""
    assert cpu_ops(placement.predict(model(text.replace("MODE", "cubic")), ort_version="1.23")) == ["Resize"]
    assert placement.predict(model(text.replace("MODE", "linear")), ort_version="1.23").cpu_count == 0


def test_int64_from_an_initializer_is_refused_by_the_strided_emulation_of_1_14():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[4] i) => (int64[4] y) {
        one = Constant <value = int64[4] {1, 1, 1, 1}> ()
        y = Add(i, one)
    }""")
    old = placement.predict(m, ort_version="1.14")
    assert cpu_ops(old) == ["Add"] and "strided 32-bit" in old.cpu_nodes[0]["reason"]
    assert placement.predict(m, ort_version="1.18").cpu_count == 0


# ** CPU preference, copies **

DYNAMIC_RESHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 6] x) => (float[N, 2, 3] y, float[N, 6] z) {
    a = Relu(x)
    s = Shape(a)
    i0 = Constant <value = int64 {0}> ()
    n = Gather <axis = 0> (s, i0)
    axes = Constant <value = int64[1] {0}> ()
    n1 = Unsqueeze(n, axes)
    tail = Constant <value = int64[2] {2, 3}> ()
    shape = Concat <axis = 0> (n1, tail)
    y = Reshape(a, shape)
    nf = Cast <to = 1> (n)
    z = Mul(a, nf)
}"""


def test_shape_chain_feeding_reshape_stays_on_cpu_when_dynamic():
    # Measured (1.17.3 and 1.24.3, `run.sh /tmp/dmlkit V dynamic_reshape.onnx --list-nodes --dim N=4`):
    # CPU: Gather, Cast; one MemcpyFromHost.  ORT's level-1 ReshapeFusion turns the
    # Gather/Unsqueeze/Concat shape into the constant [0, 2, 3], so only the Cast's chain stays.
    p = placement.predict(model(DYNAMIC_RESHAPE), ort_version="1.23")
    assert cpu_ops(p) == ["Cast", "Gather"]
    assert all("CPU-preference" in r for r in reasons(p).values())
    # the Mul reads the CPU Cast: one copy.
    assert [(e["value"], e["direction"], e["consumers"][0].startswith("Mul")) for e in p.memcpy["edges"]] == [
        ("nf", "from_host", True)]
    text = " ".join(p.partitions["blockers"])
    assert "Shape cannot be part of a DML graph" in text
    assert "without a static shape" in text
    # dmlopt's own replay of the folding (no ReshapeFusion) keeps the whole chain on the CPU
    replayed = placement.predict(model(DYNAMIC_RESHAPE), ort_version="1.23", fold=False)
    assert cpu_ops(replayed) == ["Cast", "Concat", "Gather", "Unsqueeze"]
    assert "Reshape reads a CPU input that is computed at run time" in " ".join(replayed.partitions["blockers"])


def test_shape_chain_is_folded_by_ort_when_static():
    p = placement.predict(model(DYNAMIC_RESHAPE.replace("N", "4")), ort_version="1.14")
    assert p.cpu_count == 0 and p.copy_count == 0
    assert p.folded_nodes == 5 and p.nodes == 3  # Shape, Gather, Unsqueeze, Concat, Cast fold away
    assert p.partitions["compiled"]
    unfolded = placement.predict(model(DYNAMIC_RESHAPE.replace("N", "4")), ort_version="1.14", fold=False)
    assert unfolded.cpu_count == 4


def test_one_copy_per_value_not_per_consumer_and_graph_inputs():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 5, 6, 8] x, float[5, 7, 8] k) => (float[2, 5, 6, 7] y1, float[2, 5, 6, 7] y2,
                                                  float[2, 5, 6, 8] y3) {
        e = Einsum <equation = "bhwc,hkc->bhwk"> (x, k)
        y1 = Relu(e)
        y2 = Sigmoid(e)
        y3 = Relu(x)
    }""")
    p = placement.predict(m, ort_version="1.14")
    # e: one MemcpyFromHost shared by Relu and Sigmoid; x is read on both sides: one copy node.
    edges = {(e["value"], e["direction"]): e["consumers"] for e in p.memcpy["edges"]}
    assert set(edges) == {("e", "from_host"), ("x", "from_host")}
    assert len(edges[("e", "from_host")]) == 2 and p.copy_count == 2


# ** partitions **

def test_nary_sum_blocks_one_compiled_graph_binary_sum_does_not():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] a, float[4] b, float[4] c) => (float[4] y) {
        r = Relu(a)
        s = Sum(ARGS)
        y = Relu(s)
    }"""
    nary = placement.predict(model(text.replace("ARGS", "r, b, c")), ort_version="1.23")
    assert nary.cpu_count == 0 and not nary.partitions["compiled"] and nary.partitions["count"] == 2
    assert any("Sum with more than 2 inputs" in b for b in nary.partitions["blockers"])
    binary = placement.predict(model(text.replace("ARGS", "r, b")), ort_version="1.23")
    assert binary.partitions["compiled"] and binary.partitions["count"] == 1


IF_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x, bool c) => (float[4] y) {
    a = Relu(x)
    y = If(c) <then_branch = t () => (float[4] o) { o = Sigmoid(a) },
              else_branch = e () => (float[4] o) { o = Neg(a) }>
}"""


def test_if_disables_partitioning_and_its_bodies_are_predicted():
    old = placement.predict(model(IF_MODEL), ort_version="1.14")
    assert cpu_ops(old) == ["If"]
    assert old.partitions["count"] == 0 and not old.partitions["compiled"]
    assert "If/Loop/Scan" in old.partitions["blockers"][0]
    assert old.subgraphs == ["If_1/then_branch", "If_1/else_branch"]
    assert old.nodes == 4  # Relu, If, and one node in each body
    new = placement.predict(model(IF_MODEL), ort_version="1.23")
    assert new.cpu_count == 0  # If registered on DML (cond in CPU memory) from the 1.17-era table


# ** SAM **

@pytest.mark.parametrize("version", ["1.14", "1.18"])
def test_sam_small_under_old_runtimes_has_cpu_einsums_and_copies(version):
    p = placement.predict(dmlopt.load(DATA / "sam_small.onnx"), ort_version=version)
    assert set(cpu_ops(p)) == {"Einsum"} and p.cpu_count > 0
    assert p.copy_count > 0 and p.memcpy["bytes"] > 0
    assert not p.partitions["compiled"]


def test_sam_small_under_newest_runtime_compiles_whole():
    p = placement.predict(dmlopt.load(DATA / "sam_small.onnx"), ort_version="1.23")
    assert p.cpu_count == 0 and p.copy_count == 0 and p.partitions["compiled"]


def test_sam_small_dynamic_keeps_shape_arithmetic_on_cpu():
    p = placement.predict(dmlopt.load(DATA / "sam_small_dynamic.onnx"), ort_version="1.23")
    ops = set(cpu_ops(p))
    assert {"Gather", "Concat", "Unsqueeze"} <= ops
    # the copies carry shape-derived scalars into the data path (rel-pos scale factors)
    assert p.copy_count > 0 and all(e["bytes"] is not None and e["bytes"] <= 64 for e in p.memcpy["edges"])
    assert any("static shape" in b for b in p.partitions["blockers"])


def test_model_local_functions_are_inlined_as_ort_does():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    g (float[2, 5, 6, 8] x, float[5, 7, 8] k) => (float[2, 5, 6, 7] y) {
        y = local.RelPos(x, k)
    }
    <domain: "local", opset_import: ["" : 17]>
    RelPos (a, b) => (c) {
        e = Einsum <equation = "bhwc,hkc->bhwk"> (a, b)
        c = Relu(e)
    }""")
    p = placement.predict(m, ort_version="1.14")
    assert cpu_ops(p) == ["Einsum"] and p.nodes == 2


def test_predict_leaves_the_model_unchanged():
    m = dmlopt.load(DATA / "sam_small_dynamic.onnx")
    before = onnx.printer.to_text(ir.to_proto(m).graph)
    placement.predict(m, ort_version="1.14")
    assert onnx.printer.to_text(ir.to_proto(m).graph) == before


# ** output **

def test_to_dict_is_json_and_summary_table_names_reasons():
    p = placement.predict(dmlopt.load(DATA / "sam_small.onnx"), ort_version="1.14").to_dict()
    assert {"cpu_nodes", "memcpy", "partitions", "ort_version", "data_source"} <= set(p)
    json.dumps(p)
    text = placement.summary_table(p)
    assert "on CPU: 6" in text and "recognized-equation table" in text and "copies (Memcpy): 9" in text


def test_inspect_api_and_cli_report_placement():
    info = dmlopt.inspect(DATA / "sam_small.onnx", ep="dml", ort_version="1.14")
    assert info["placement"]["ort_version"] == "1.14" and info["placement"]["memcpy"]["count"] > 0
    out = subprocess.run([sys.executable, "-m", "dmlopt", "inspect", str(DATA / "sam_small.onnx"), "--ep", "dml",
                          "--ort-version", "1.14", "--json"], capture_output=True, text=True, check=True)
    placed = json.loads(out.stdout)["placement"]
    assert placed["memcpy"]["count"] == info["placement"]["memcpy"]["count"]
    assert len(placed["cpu_nodes"]) == len(info["placement"]["cpu_nodes"])


def test_a_graph_output_that_ort_folds_is_predicted_folded():
    """ORT folds a constant node that is itself a graph output; the fold replaces the output
    (the model's other output keeps its node on the GPU)."""
    m = model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] c, float[2] y) {
            a = Constant <value = float[2] {1.0, 2.0}> ()
            c = Add (a, a)
            y = Mul (x, c)
        }""")
    p = placement.predict(m)
    assert p.folded_nodes >= 1
    assert cpu_ops(p) == [] and p.dml_nodes == 1


def test_large_weights_reach_orts_level1_as_inputs_and_come_back_as_the_callers_tensors():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = np.ones((1024, 512), np.float32)  # 2 MB: over placement_ort.LARGE_BYTES
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])], [numpy_helper.from_array(weight, "w")])
    m = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    work, _ = placement.prepare(m)
    assert "ORT's level-1" in work.graph.meta[placement.LEVEL1_KEY]
    assert [v.name for v in work.graph.inputs] == ["x"]
    assert work.graph.initializers["w"].const_value is m.graph.initializers["w"].const_value
    assert placement.predict(m, prepared=(work, 0)).partitions["compiled"]


def test_a_node_on_a_large_weight_is_folded_as_ort_folds_it():
    """ORT folds Transpose(W) when it has W; dmlopt hands weights over 1 MB to ORT's level-1 optimizer as
    inputs (no copies), so it folds such nodes itself: no one-node DML partition the real EP never had
    (the 512-px SAM ViT-B export at 1.17.3: 716 CPU nodes, 108 copies, 0 partitions, as measured)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(512 * 1024, dtype=np.float32).reshape(1, 512, 1024), "W")  # 2 MiB
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["W"], ["wt"], perm=[0, 2, 1], name="transpose_w"),
         helper.make_node("Add", ["x", "wt"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024, 512])], [w])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    prepared = placement.prepared_graph(model)
    assert [n.op_type for n in prepared.graph] == ["Add"]
    assert placement.predict(model, ort_version="1.17.3").partitions["count"] == 0
