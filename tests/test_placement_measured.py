"""The placement prediction equals the real DirectML EP: CPU nodes, Memcpy nodes, compiled partitions.

REAL holds what ORT's verbose log showed for the bundled models and dmlopt's outputs of them
(tests/measured/*.dmlopt.onnx: `dmlopt optimize dmlopt/data/M.onnx -o tests/measured/M.dmlopt.onnx
--ort-version V --no-time` with the derived tables, the same bytes for every V then; kept as files, so the
counts stay those of these bytes) and a small corpus of real exports, per onnxruntime-node version of the
dml-wine kit.  Recorded with (graph fusion on, every node listed):

    LOG=... bash ../shared/dml-wine/run.sh /tmp/dmlkit V MODEL.onnx --list-nodes --no-cpu-check

and read by models/dml_real.read_log (`python -m benchmarks.dml_placement --kit /tmp/dmlkit` re-measures
all of them).  The dml_host test re-measures live when DMLOPT_DML_HOST names a kit folder.
"""

from __future__ import annotations

import pathlib

import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.targets.dml import placement
from models.dml_real import KIT_SCRIPT, run_real

DATA = pathlib.Path(dmlopt.__file__).parent / "data"
MEASURED = pathlib.Path(__file__).parent / "measured"
VERSIONS = ("1.17.3", "1.19.2", "1.24.3", "1.31.1")

# (CPU nodes, Memcpy nodes, compiled DML partitions) per version, in VERSIONS order.  Measured 2026-12-05.
REAL = {
    # 1.17.3: the 6 rel-pos Einsums on the CPU EP; 1.17.3 and 1.19.2: ORT knows only the rank of an Einsum's
    # output (ONNX < 1.17), so the Unsqueeze/Add after each run as standalone kernels between 7 partitions.
    "sam_small.onnx": [(6, 9, 7), (0, 0, 7), (0, 0, 1), (0, 0, 1)],
    # dynamic batch: the shape arithmetic stays on the CPU (CSE'd by ORT's level 1 first); no partition.
    "sam_small_dynamic.onnx": [(179, 27, 0), (173, 12, 0), (173, 12, 0), (173, 12, 0)],
    "cnn_leaky.onnx": [(0, 0, 1)] * 4,
    "cnn_relu.onnx": [(0, 0, 1)] * 4,
    # dmlopt's outputs: SAM compiles as one partition on every version (MultiHeadAttention and
    # SkipLayerNormalization on DirectML from 1.17.3 on); the dynamic one keeps its dynamic batch.
    "sam_small.dmlopt.onnx": [(0, 0, 1)] * 4,
    "sam_small_dynamic.dmlopt.onnx": [(173, 12, 0)] * 4,
    # `dmlopt optimize sam_small_dynamic.onnx --dim batch=1 --ort-version 1.14`: FusedMatMul and SkipLayerNormalization,
    # whose shapes ORT's symbolic inference gives up on (dmlopt's contrib rules type them): one partition.
    "sam_small_dynamic.batch1-1.14.dmlopt.onnx": [(0, 0, 1)] * 4,
    "cnn_leaky.dmlopt.onnx": [(0, 0, 1)] * 4,
    "cnn_relu.dmlopt.onnx": [(0, 0, 1)] * 4,
    # Corpus of real exports (tests/measured/): models/torch_cnn.py (Conv, LeakyRelu, PRelu, ConvTranspose) and
    # models/vit_tiny.py (TorchScript exporter), static and with a dynamic batch, and dmlopt's outputs of them.
    "torch_cnn.onnx": [(0, 0, 1)] * 4,
    "torch_cnn.dmlopt.onnx": [(0, 0, 1)] * 4,
    "torch_cnn_dynamic.onnx": [(0, 0, 0)] * 4,  # all on DirectML, every node a standalone kernel
    "torch_cnn_dynamic.dmlopt.onnx": [(0, 0, 0)] * 4,
    "vit_tiny.onnx": [(0, 0, 1)] * 4,
    "vit_tiny.dmlopt.onnx": [(0, 0, 1)] * 4,
    "vit_tiny_dynamic.onnx": [(79, 2, 0)] * 4,  # the exporter's shape arithmetic on the CPU
    "vit_tiny_dynamic.dmlopt.onnx": [(77, 2, 0)] * 4,
    # models/hf_tiny.py (transformers): Swin with a dynamic batch (its window arithmetic on the CPU), DETR.
    "swin_tiny_dynamic.onnx": [(272, 8, 0)] * 4,
    "detr_tiny.onnx": [(0, 0, 1)] * 4,
    # float16 (issue 31; measured 2026-12-06 through the kit's run.sh): dmlopt's `--target dml --fp16` outputs of
    # models/efficientvit.py (whose Pad constant sat behind the CPU EP's float16->float32 Cast: 1 copy and 3
    # partitions predicted), models/vit_tiny.py and the bundled small SAM.
    "efficientvit.fp16.dmlopt.onnx": [(0, 0, 1)] * 4,
    "vit_tiny.fp16.dmlopt.onnx": [(0, 0, 1)] * 4,
    "sam_small.fp16.dmlopt.onnx": [(0, 0, 1)] * 4,
}


def model_path(name: str) -> pathlib.Path:
    return MEASURED / name if (MEASURED / name).exists() else DATA / name


@pytest.fixture(scope="module")
def prepared():
    cache = {}

    def get(name):
        if name not in cache:
            model = ir.load(model_path(name))
            cache[name] = (model, placement.prepare(model))
        return cache[name]
    return get


def counts(model, version, prep) -> tuple[int, int, int]:
    p = placement.predict(model, ort_version=version, prepared=prep)
    return p.cpu_count, p.copy_count, p.partitions["count"]


@pytest.mark.parametrize("name", sorted(REAL))
def test_prediction_equals_the_real_ep(name, prepared):
    model, prep = prepared(name)
    predicted = [counts(model, v, prep) for v in VERSIONS]
    assert predicted == REAL[name]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_kit_version_has_its_measured_table(version):
    data = placement.load_data(version)
    assert data.version == ".".join(version.split(".")[:2]) and data.measured
    assert data.raw["measured"]["ort_version_full"] == version
    assert data.raw["measured"]["directml_dll_bytes"] > 0
    assert data.raw["directml_version"] == data.raw["measured"]["directml_version"]  # the DLL's FileVersion
    assert data.raw["directml_version"].startswith(("1.13.", "1.15."))


@pytest.mark.parametrize("version", VERSIONS)
def test_dmlopt_sam_output_is_one_compiled_graph_without_blockers(version, prepared):
    # issue 22: inspect of the written model said 7 partitions and "freeze the dynamic axes" (the com.microsoft
    # outputs had no shapes) where optimize said one compiled partition; the real EP compiles one.
    model, prep = prepared("sam_small.dmlopt.onnx")
    p = placement.predict(model, ort_version=version, prepared=prep)
    assert p.partitions["compiled"] and p.partitions["blockers"] == [] and p.level1.startswith("ORT's level-1")
    assert "freeze" not in placement.summary_table(p.to_dict())


def test_versions_between_tables_use_the_nearest_measured_one_and_say_so():
    p = placement.predict(ir.load(DATA / "cnn_relu.onnx"), ort_version="1.28")
    assert p.ort_version == "1.24" and p.measured_table
    text = placement.summary_table(p.to_dict())
    assert "ORT 1.28 asked: nearest measured table 1.24" in text.splitlines()[0]


def test_derived_tables_are_marked_as_such():
    for version in placement.available_versions():
        data = placement.load_data(version)
        if not data.measured:
            rows = [r for rows in data.raw["ops"].values() for r in rows]
            assert data.raw.get("derived") is True and rows and all(not r["source"].startswith("measured")
                                                                    for r in rows)


@pytest.mark.dml_host
@pytest.mark.skipif(not pathlib.Path(KIT_SCRIPT).exists(), reason=f"needs the kit's {KIT_SCRIPT}")
@pytest.mark.parametrize("name", ["sam_small.onnx", "sam_small_dynamic.onnx", "sam_small.dmlopt.onnx",
                                  "vit_tiny_dynamic.onnx", "efficientvit.fp16.dmlopt.onnx"])
@pytest.mark.parametrize("version", VERSIONS)
def test_prediction_equals_a_live_run(name, version, tmp_path, prepared, dml_host):
    """The host folder comes from the root conftest's `dml_host` (DMLOPT_DML_HOST; a skip saying why)."""
    kit = str(dml_host.root)
    if version not in dml_host.versions:
        pytest.skip(f"ORT {version} is not set up in {kit}")
    real = run_real(kit, version, model_path(name), tmp_path / "run.log")
    model, prep = prepared(name)
    assert counts(model, version, prep) == (real["cpu"], real["copies"], real["partitions"])
    assert (real["cpu"], real["copies"], real["partitions"]) == REAL[name][VERSIONS.index(version)]


def test_einsum_rank_only_shapes_are_named_as_such_not_as_dynamic_axes(prepared):
    model, prep = prepared("sam_small.onnx")
    blockers = placement.predict(model, ort_version="1.19.2", prepared=prep).partitions["blockers"]
    assert "infers only an Einsum's rank" in blockers[0] and not any("freeze" in b for b in blockers)
    dynamic, prep_d = prepared("sam_small_dynamic.onnx")
    blockers = placement.predict(dynamic, ort_version="1.19.2", prepared=prep_d).partitions["blockers"]
    assert any("freeze the dynamic axes" in b for b in blockers)  # there the batch axis is dynamic


def test_contrib_shapes_write_nothing_into_the_working_directory(tmp_path, monkeypatch):
    # ORT's SymbolicShapeInference.infer_shapes saves sym_shape_infer_temp.onnx (+ .data files) into the working
    # directory when its inference is incomplete, as it is on this model; the prediction must not.
    monkeypatch.chdir(tmp_path)
    model = ir.load(model_path("sam_small_dynamic.batch1-1.14.dmlopt.onnx"))
    assert placement.predict(model, ort_version="1.24").partitions["compiled"]
    assert list(tmp_path.iterdir()) == []


def test_a_measured_placement_decides_graph_capture():
    """Issue 31: the graph-capture line followed the prediction even right after the real EP was measured."""
    from dmlopt.targets.graph_capture import graph_capture_readiness, with_measured_placement

    model = ir.load(DATA / "sam_small_dynamic.onnx")
    predicted = graph_capture_readiness(model, "dml", "1.31")
    assert any(b["kind"] == "copies" for b in predicted.blockers)
    measured = with_measured_placement(predicted, {"found": True, "cpu_nodes": 0, "copies": 0}, "1.31.1")
    assert not any(b["kind"] in ("copies", "cpu_output") for b in measured.blockers)
    assert measured.basis == "DirectML placement measured on the real EP (ORT 1.31.1)"
    assert any(b["kind"] == "dynamic_dims" for b in measured.blockers)  # not a placement matter: kept
    worse = with_measured_placement(graph_capture_readiness(ir.load(DATA / "cnn_relu.onnx"), "dml", "1.31"),
                                    {"found": True, "cpu_nodes": 2, "copies": 3, "cpu_node_names": ["a", "b"]}, "1.31.1")
    assert not worse.ready and "2 nodes on CPU (measured), 3 copies" in worse.line()
