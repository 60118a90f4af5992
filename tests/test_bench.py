"""Timing: what a measurement holds, provider options, --tune-ep, the bench command, progress bars."""

from __future__ import annotations

import importlib.resources
import io
import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.io import progress
from dmlopt.runtime import bench, sessions as runtime

from dmlopt.targets.dml import emulate
from dmlopt.errors import InputError, ProviderError, UsageError
from tests.conftest import conv_leaky_model

RUNS = dict(runs=3, warmup=1)


@pytest.fixture
def model():
    return ir.from_proto(conv_leaky_model(batch=1))


def profile_events(copies_per_run):
    """A synthetic ORT profile: one model_run per entry with that many Memcpy nodes and two compute nodes."""
    events, ts = [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 10}], 100
    for copies in copies_per_run:
        run_start = ts
        nodes = [("Memcpy_token_%d" % i, "MemcpyFromHost", "CUDAExecutionProvider") for i in range(copies)]
        nodes += [("conv", "Conv", "CUDAExecutionProvider"), ("shape", "Shape", "CPUExecutionProvider")]
        for name, op, provider in nodes:
            ts += 5
            events.append({"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": 3,
                           "args": {"op_name": op, "provider": provider}})
            events.append({"cat": "Node", "name": f"{name}_fence_before", "ts": ts, "dur": 0, "args": {}})
        events.append({"cat": "Session", "name": "model_run", "ts": run_start, "dur": ts + 5 - run_start})
        ts += 50
    return events


def test_profile_counts_copies_of_the_last_run_only():
    s = bench.profile_summary(profile_events([5, 2]))
    assert s["copies"] == 2
    assert s["copy_ops"] == {"MemcpyFromHost": 2}
    assert s["nodes_by_provider"] == {"CUDAExecutionProvider": 1, "CPUExecutionProvider": 1}
    assert s["cpu_ops"] == {"Shape": 1}
    assert bench.profile_summary([{"cat": "Session", "name": "session_initialization", "ts": 0}]) is None


def timed_runs(durations):
    """A profile with one model_run per entry: node name -> (op, duration in us)."""
    events, ts = [], 0
    for nodes in durations:
        start = ts
        for name, (op, dur) in nodes.items():
            ts += dur + 1
            events.append({"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
                           "args": {"op_name": op, "provider": "CUDAExecutionProvider"}})
        events.append({"cat": "Session", "name": "model_run", "ts": start, "dur": ts + 1 - start})
        ts += 10
    return events


def test_profile_times_by_op_type_and_slowest_nodes_skip_the_first_run():
    first = {"add_1": ("Add", 9000), "add_2": ("Add", 9000), "mm": ("MatMul", 9000)}  # a cold first run
    warm_a = {"add_1": ("Add", 300), "add_2": ("Add", 100), "mm": ("MatMul", 1000)}
    warm_b = {"add_1": ("Add", 500), "add_2": ("Add", 100), "mm": ("MatMul", 3000)}
    s = bench.profile_summary(timed_runs([first, warm_a, warm_b]), slowest=2)
    assert s["profiled_runs"] == 2
    assert s["op_time_ms"] == {"MatMul": {"ms": pytest.approx(2.0), "nodes": 1},
                               "Add": {"ms": pytest.approx(0.5), "nodes": 2}}
    assert list(s["op_time_ms"]) == ["MatMul", "Add"]  # slowest op type first
    assert s["kernel_ms"] == pytest.approx(2.5)
    assert [(n["node"], n["op"]) for n in s["slowest_nodes"]] == [("mm", "MatMul"), ("add_1", "Add")]
    assert s["slowest_nodes"][1]["ms"] == pytest.approx(0.4)


def test_profile_table_names_op_types_nodes_and_the_cuda_launch_caveat(monkeypatch):
    s = bench.profile_summary(timed_runs([{"mm": ("MatMul", 2000), "add": ("Add", 500)}]))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    text = bench.profile_table(s, "CUDAExecutionProvider")
    assert "MatMul" in text and "80.0%" in text and "slowest nodes" in text
    assert "CUDA_LAUNCH_BLOCKING=1" in text
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    assert "CUDA_LAUNCH_BLOCKING" not in bench.profile_table(s, "CUDAExecutionProvider")
    assert "none taken" in bench.profile_table(None, "CPUExecutionProvider")


def test_webgpu_profile_reads_gpu_timestamps_where_the_ep_gives_them_and_says_so_where_not():
    """Issue 30: the WebGPU EP's node times are CPU-side dispatch; its GPU times come as ``Api`` events."""
    events = timed_runs([{"mm": ("MatMul", 2000)}, {"mm": ("MatMul", 1000)}])
    plain = bench.profile_table(bench.profile_summary(events), "WebGpuExecutionProvider")
    assert "CPU-side dispatch times" in plain and "GPU kernel time" not in plain
    gpu = [{"cat": "Api", "name": "mm&MatMulProgram", "ts": 1, "dur": 3000},
           {"cat": "Api", "name": "mm&MatMulProgram", "ts": 9, "dur": 1000},
           {"cat": "Api", "name": "sm&SoftmaxProgram", "ts": 5, "dur": 400}]
    s = bench.profile_summary(events + gpu)
    assert s["gpu_kernel_ms"] == pytest.approx(2.2) and s["gpu_runs"] == 2
    assert [k["kernel"] for k in s["gpu_kernels"]] == ["mm&MatMulProgram", "sm&SoftmaxProgram"]
    text = bench.profile_table(s, "WebGpuExecutionProvider")
    assert "GPU kernel time" in text and "2.200 ms" in text and "CPU-side dispatch" not in text


def test_cuda_graph_needs_static_output_shapes():
    path = importlib.resources.files("dmlopt.data") / "sam_small_dynamic.onnx"  # a dynamic batch axis
    session = runtime.session(ir.load(str(path)), "cpu")
    with pytest.raises(InputError, match="cannot run as a CUDA graph: output 'image_embeddings'"):
        bench.static_output_shapes(session)
    fixed = runtime.session(ir.from_proto(conv_leaky_model(batch=1)), "cpu")
    assert bench.static_output_shapes(fixed) == [list(o.shape) for o in fixed.get_outputs()]


def test_cuda_graph_on_another_provider_is_a_usage_error(model):
    for flag in ("cuda_graph", "graph_capture"):
        with pytest.raises(UsageError, match="graph capture applies to the CUDA and WebGPU EPs"):
            bench.Timer(model, "cpu", **{flag: True})


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.has_target("cuda"), reason="needs the CUDA EP")
def test_cuda_graph_runs_with_outputs_bound_once(model):
    out = bench.time_model(model, "cuda", runs=3, warmup=1, cuda_graph=True)
    assert out["provider"] == "CUDAExecutionProvider"
    assert "CUDA graph" in out["io_binding"] and out["provider_options"]["enable_cuda_graph"] == "1"


def test_time_model_reports_provider_latency_and_copies(model):
    out = bench.time_model(model, "cpu", runs=4, warmup=2)
    assert out["provider"] == "CPUExecutionProvider"
    lat = out["latency_ms"]
    assert lat["runs"] == 4 and 0 < lat["min"] <= lat["median"] <= lat["p90"]
    assert out["load_s"] > 0
    assert out["copies"] == 0  # measured from the profile: the CPU EP copies nothing
    assert out["profile"]["nodes_by_provider"]["CPUExecutionProvider"] >= 1
    assert out["io_binding"] == "none"


def test_no_warmup_means_no_profile(model):
    out = bench.time_model(model, "cpu", runs=2, warmup=0)
    assert out["copies"] is None and out["profile"] is None


def test_compare_alternates_and_gives_per_pair_ratios(model):
    other = ir.from_proto(conv_leaky_model(batch=1, alpha=0.2))
    out = bench.compare({"a": model, "b": other}, "cpu", runs=5, warmup=1, baseline="a")
    assert out["baseline"] == "a" and out["provider"] == "CPUExecutionProvider"
    assert out["models"]["a"]["ratios"] == [1.0] * 5 and out["models"]["a"]["ratio_median"] == 1.0
    assert len(out["models"]["b"]["ratios"]) == 5
    assert out["models"]["b"]["ratio_median"] == float(np.median(out["models"]["b"]["ratios"]))


def test_a_provider_that_did_not_start_is_an_error(model, monkeypatch):
    """ORT falls back to the CPU when a GPU provider fails to load; bench must not time that silently."""
    real = runtime.session

    def cpu_only(m, target="cpu", **kw):
        return real(m, "cpu", **{k: v for k, v in kw.items() if k != "provider_options"})

    monkeypatch.setattr(runtime, "session", cpu_only)
    with pytest.raises(ProviderError, match="asked for CUDAExecutionProvider but ONNX Runtime started "
                                            "CPUExecutionProvider"):
        bench.Timer(model, "cuda")


def test_io_binding_runs_give_the_same_outputs(model):
    timer = bench.Timer(model, "cpu", io_binding=True, profile=False)
    assert timer.io_binding == "inputs on cpu, outputs on cpu"
    timer.once()
    bound = timer._binding.copy_outputs_to_cpu()[0]
    plain = timer.session.run(None, timer.feeds)[0]
    np.testing.assert_array_equal(bound, plain)


def test_parse_provider_options():
    assert bench.parse_provider_options("cuda", ["cudnn_conv_algo_search=heuristic", "prefer_nhwc=1"]) == {
        "cudnn_conv_algo_search": "HEURISTIC", "prefer_nhwc": "1"}
    assert bench.parse_provider_options("dml", ["device_id=1"], disable_metacommands=True) == {
        "device_id": "1", "disable_metacommands": "true"}
    assert bench.parse_provider_options("cuda", ["gpu_mem_limit=1024"]) == {"gpu_mem_limit": "1024"}
    with pytest.raises(UsageError, match="not one of EXHAUSTIVE, HEURISTIC, DEFAULT"):
        bench.parse_provider_options("cuda", ["cudnn_conv_algo_search=FAST"])
    with pytest.raises(UsageError, match="KEY=VALUE"):
        bench.parse_provider_options("cuda", ["prefer_nhwc"])
    with pytest.raises(UsageError, match="applies to DirectML"):
        bench.parse_provider_options("cpu", [], disable_metacommands=True)
    assert bench.split_options({"session.intra_op.allow_spinning": 0, "device_id": 1}) == (
        {"device_id": "1"}, {"session.intra_op.allow_spinning": "0"})


def test_tune_grid_starts_with_ort_defaults_and_leaves_fixed_keys_alone():
    grid = bench.tune_grid("cuda")
    assert len(grid) == 6
    assert grid[0] == {"cudnn_conv_algo_search": "EXHAUSTIVE", "prefer_nhwc": "0"}
    assert {g["cudnn_conv_algo_search"] for g in grid} == {"EXHAUSTIVE", "HEURISTIC", "DEFAULT"}
    fixed = bench.tune_grid("cuda", {"prefer_nhwc": "1", "use_tf32": "0"})
    assert len(fixed) == 3 and all(g["prefer_nhwc"] == "1" and g["use_tf32"] == "0" for g in fixed)
    assert bench.tune_grid("cpu") == [{bench.SPINNING: "1"}, {bench.SPINNING: "0"}]


def test_tune_ep_times_every_option_set_and_names_the_best(model):
    out = bench.tune_ep(model, "cpu", **RUNS)
    labels = {f"{bench.SPINNING}=1", f"{bench.SPINNING}=0"}
    assert set(out["models"]) == labels
    assert out["best"] in labels and out["baseline"] == f"{bench.SPINNING}=1"
    assert out["best_options"] == {bench.SPINNING: out["best"].split("=")[1]}
    assert out["flags"] == f"--provider-option {out['best']}"
    assert "best: " in bench.to_table(out)


def test_to_table_escapes_failure_text_and_node_names(model):
    out = bench.tune_ep(model, "cpu", **RUNS)
    out["failed"]["x=1"] = "ORT said \x1b[2Jno\r\nbest: forged"
    out["models"][out["best"]]["profile"]["slowest_nodes"][0]["node"] = "conv\nbest: forged\x07"
    text = bench.to_table(out, profile=True)
    assert not any(c in text for c in "\x1b\r\x07")
    assert "x=1: could not start: ORT said \\x1b[2Jno\\r\\nbest: forged" in text
    assert "conv\\nbest: forged\\x07" in text
    (best,) = [line for line in text.splitlines() if line.startswith("best: ")]  # one line, not forged ones
    assert best == f"best: {out['best']}  ({out['flags']})" or best.startswith("best: no option set is measurably")


def test_retime_reports_before_after_and_speedup(model):
    after = model.clone()
    t = bench.retime(model, after, "cpu", runs=4)
    assert t["provider"] == "CPUExecutionProvider" and t["runs"] == 4
    assert t["speedup"] == pytest.approx(1.0 / t["ratio_median"])
    assert t["before"]["runs"] == t["after"]["runs"] == 4
    assert t["copies_before"] == t["copies_after"] == 0


def test_time_emulated_splits_by_predicted_placement():
    from dmlopt.cli.demo import bundled_path

    path = bundled_path("sam_small_dynamic.onnx")
    if not path.is_file():
        pytest.skip("bundled model not built")
    out = emulate.time_emulated(ir.load(path), "dml-1.14", runs=2, warmup=1, dims={"batch": 1}, gpu_target="cpu")
    assert out["provider"] == "emulated-dml-1.14 (GPU parts on CPUExecutionProvider)"
    assert out["predicted_cpu_nodes"] > 0 and out["copies"] == out["predicted_copies"] > 0
    assert "cpu:" in out["parts"] and "gpu:" in out["parts"]
    assert out["latency_ms"]["runs"] == 2


def test_parse_emulate():
    assert emulate.parse_emulate("dml-1.14") == "1.14"
    for bad in ("dml", "cuda-1.14", "dml-latest", "dml-1"):
        with pytest.raises(UsageError, match="dml-MAJOR.MINOR"):
            emulate.parse_emulate(bad)


# -- the command ---------------------------------------------------------------------------

def test_bench_json(cli, model_path):
    r = cli("bench", model_path, "--ep", "cpu", "--runs", 3, "--warmup", 1, "--shape", "x:1,3,8,8", "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["provider"] == "CPUExecutionProvider"
    assert set(out["latency_ms"]) >= {"min", "median", "p90"} and out["latency_ms"]["runs"] == 3
    assert out["copies"] == 0 and out["load_s"] > 0


def test_bench_profile_table_and_json(cli, model_path):
    args = ("bench", model_path, "--ep", "cpu", "--runs", 2, "--warmup", 2, "--shape", "x:1,3,8,8", "--profile")
    r = cli(*args)
    assert r.code == 0, r.err
    assert "node time by op type" in r.out and "slowest nodes" in r.out and "Conv" in r.out
    r = cli(*args, "--json")
    profile = json.loads(r.out)["profile"]
    assert profile["op_time_ms"]["Conv"]["nodes"] >= 1 and profile["slowest_nodes"]
    assert profile["kernel_ms"] == pytest.approx(sum(e["ms"] for e in profile["op_time_ms"].values()))


def test_bench_compare_table(cli, model_path, tmp_path):
    other = tmp_path / "other.onnx"
    onnx.save(conv_leaky_model(alpha=0.2), other)
    r = cli("bench", model_path, "--compare", other, "--runs", 2, "--warmup", 1, "--dim", "N=1")
    assert r.code == 0, r.err
    # each model by its file, the inputs both ran, the ratio with its spread and run count
    assert "ratio vs model.onnx" in r.out and "other.onnx" in r.out and "copies" in r.out
    assert "inputs (same for every model): x 1x" in r.out and "over 2 alternating pairs" in r.out


@pytest.mark.skipif(runtime.has_target("cuda"), reason="CUDA is present here")
def test_bench_missing_provider_is_exit_2_naming_what_is_present(cli, model_path):
    r = cli("bench", model_path, "--ep", "cuda")
    assert r.code == 2
    assert "CUDAExecutionProvider is not available" in r.err and "CPUExecutionProvider" in r.err


def test_bench_bad_arguments_are_one_line_exit_2(cli, model_path):
    for args in (["--runs", "0"], ["--provider-option", "x"], ["--disable-metacommands", "--ep", "cpu"],
                 ["--emulate", "dml-1.14", "--ep", "cpu"], ["--emulate", "cuda-1"],
                 ["--tune-ep", "--compare", str(model_path)], ["--profile", "--warmup", "0"],
                 ["--cuda-graph", "--ep", "cpu"], ["--cuda-graph", "--profile", "--ep", "cpu"],
                 ["--graph-capture", "--ep", "cpu"], ["--graph-capture", "--profile", "--ep", "cpu"]):
        r = cli("bench", model_path, *args)
        assert r.code == 2, args
        assert len([l for l in r.err.splitlines() if l.strip()]) == 1, r.err



def test_cuda_graph_refusal_names_what_stops_capture(cli, model_path, monkeypatch):
    """ORT's refusal comes with the readiness analysis: here the dynamic batch dim of the model."""
    def refuse(*args, **kwargs):
        raise InputError("the model cannot run as a CUDA graph: outputs of unknown shape")

    monkeypatch.setattr(runtime, "resolve_ep", lambda ep: "cuda")
    monkeypatch.setattr(bench, "time_model", refuse)
    r = cli("bench", model_path, "--ep", "cuda", "--cuda-graph")
    assert r.code == 2
    lines = [l for l in r.err.splitlines() if l.strip()]
    assert len(lines) == 1, r.err
    assert "outputs of unknown shape" in lines[0] and "graph capture (CUDA" in lines[0]
    assert "not ready" in lines[0] and "'N'" in lines[0], lines[0]

# -- progress --------------------------------------------------------------------------------

class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_draws_on_a_terminal_and_stays_silent_elsewhere():
    tty = FakeTerminal()
    with progress.Bar("timing", 4, stream=tty) as bar:
        for _ in range(4):
            bar.advance()
    text = tty.getvalue()
    assert text.endswith("\n") and "\r" in text
    assert "dmlopt: timing [" + "#" * progress.BAR_WIDTH + "] 4/4" in text
    piped = io.StringIO()
    with progress.Bar("timing", 4, stream=piped) as bar:
        bar.advance(4)
    assert piped.getvalue() == ""


def test_steps_print_whole_lines_and_hand_out_bars():
    tty = FakeTerminal()
    steps = progress.Steps(tty)
    steps("pass cleanup")
    with progress.bar_for(steps, "timing", 2) as bar:
        bar.advance(2)
    lines = tty.getvalue().split("\n")
    assert lines[0].startswith("dmlopt: [") and lines[0].endswith("] pass cleanup")
    assert "2/2" in lines[1]
    silent = progress.bar_for(print, "timing", 2)  # a plain callback has no bars
    assert not silent.enabled


def test_quiet_and_piped_stderr_get_no_progress(cli, model_path, capsys):
    from dmlopt.cli.commands import _progress, build_parser

    args = build_parser().parse_args(["bench", str(model_path), "-q"])
    assert _progress(args) is None
    args = build_parser().parse_args(["bench", str(model_path)])
    assert _progress(args) is None  # pytest's stderr is not a terminal


def _conv_batchnorm_matmul():
    """Conv+BatchNormalization (ORT folds the norm into the Conv's weight, reading both) then a MatMul
    by a large weight (prepacked on the CPU EP): rewrites and prepacking that read the weights."""
    rng = np.random.default_rng(3)
    c = 16
    weights = {"w": rng.standard_normal((c, c, 3, 3)) * 0.1, "scale": rng.random(c) + 0.5,
               "bias": rng.standard_normal(c), "mean": rng.standard_normal(c), "var": rng.random(c) + 0.5,
               "m": rng.standard_normal((c * 8 * 8, 256)) * 0.05}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), "flat"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Reshape", ["r", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], inits)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_timing_sessions_share_one_host_copy_of_the_weights_and_compute_the_same():
    model = _conv_batchnorm_matmul()
    feeds = runtime.random_inputs(runtime.input_specs(model))
    expected = runtime.session(model).run(None, feeds)[0]  # serialized, ORT's rewrites on
    cache = runtime.WeightValues()
    first = bench.Timer(model, "cpu", feeds=feeds, weight_cache=cache, profile=False)
    second = bench.Timer(model.clone(), "cpu", feeds=feeds, weight_cache=cache, profile=False)
    for timer in (first, second):
        np.testing.assert_array_equal(timer.run_outputs()[0], expected)  # same kernels, same packed weights
    shared = dict(first.session.dmlopt_shared_weights)
    assert "m" in shared and "w" in shared  # the weights ORT's rewrites and prepacking read
    assert all(shared[name] is value for name, value in second.session.dmlopt_shared_weights)


def test_a_timing_session_that_cannot_share_the_weights_starts_from_the_serialized_model(monkeypatch):
    model = _conv_batchnorm_matmul()
    feeds = runtime.random_inputs(runtime.input_specs(model))
    expected = runtime.session(model).run(None, feeds)[0]

    def refuse(*args, **kwargs):
        raise InputError("ONNX Runtime cannot load the model: weights in memory not supported")

    monkeypatch.setattr(runtime, "_shared_session", refuse)
    timer = bench.Timer(model, "cpu", feeds=feeds, profile=False)
    assert not hasattr(timer.session, "dmlopt_shared_weights")
    np.testing.assert_array_equal(timer.run_outputs()[0], expected)


def test_demo_says_too_fast_to_time_rather_than_a_spread_that_means_nothing():
    """Issue 31: sub-millisecond models showed speedups like x0.40-14.94."""
    from dmlopt.cli.demo import _speed

    assert _speed({"median": 1.0, "p10": 1 / 14.94, "p90": 1 / 0.40, "verdict": "no measurable difference"}) \
        .startswith("too fast to time here")
    assert _speed({"median": 0.8, "p10": 0.75, "p90": 0.85, "verdict": "faster"}) == "x1.25 (x1.18-1.33)"


def test_min_sample_time_repeats_a_fast_model_within_each_sample():
    from tests.conftest import conv_leaky_model

    model = dmlopt.load(conv_leaky_model(batch=1))
    timed = bench.compare({"a": model, "b": model.clone()}, "cpu", runs=3, warmup=1, min_sample_ms=30.0)
    a, b = timed["models"]["a"], timed["models"]["b"]
    assert a["runs_per_sample"] == b["runs_per_sample"] > 1  # one run of this model takes far under 30 ms
    assert len(a["ratios"]) == 3


def test_a_long_step_ticks_on_a_terminal_only(monkeypatch):
    """Issue 31: bench --ep dml (1:41) and the real-EP and WebGPU runs printed nothing until the end."""
    import time as time_mod

    monkeypatch.setattr(progress, "TICK_S", 0.01)
    tty = FakeTerminal()
    with progress.ticking(progress.Steps(tty), "bench m.onnx on the real DirectML EP"):
        time_mod.sleep(0.1)
    text = tty.getvalue()
    assert text.count("\r") >= 3 and text.endswith("s\x1b[K\n") and "bench m.onnx on the real DirectML EP ..." in text
    for quiet in (progress.Steps(io.StringIO()), progress.Steps(FakeTerminal(), enabled=False), None):
        with progress.ticking(quiet, "x"):
            pass
        assert quiet is None or quiet.stream.getvalue() == ""
