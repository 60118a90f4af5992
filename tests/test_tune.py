"""Tuning: which options are chosen, candidates timed as written, the final comparison, nothing run unvalidated.

The timing logic is tested with a fake timer standing in for bench.compare: it gives each model a
time from what the model is (its precision, whether attention is fused), so what the tuner decides
follows from what it was shown, deterministically."""

from __future__ import annotations

import json
import random

import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.engine import tune
from dmlopt.runtime import bench, sessions as runtime
from dmlopt.errors import ProviderError
from dmlopt.passes import EngineSettings, PassContext
from dmlopt.passes.attention import AttentionPass
from dmlopt.passes.attention_test import hf_attention
from dmlopt.passes.fp16 import Fp16Pass
from dmlopt.engine.pipeline import op_counts
from dmlopt.runtime.validate import DEFAULT_TOLERANCES
from tests.conftest import conv_leaky_model

MHA = "com.microsoft.MultiHeadAttention"


@pytest.fixture
def model():
    return ir.from_proto(conv_leaky_model(batch=1))


@pytest.fixture
def attention_model():
    return ir.from_proto(hf_attention())


def fp16_option():
    return next(o for o in Fp16Pass.options if o.name == "fp16")


def attention_option():
    return next(o for o in AttentionPass.options if o.name == "attention")


def is_half(model: ir.Model) -> bool:
    return any(v.dtype == ir.DataType.FLOAT16 for v in model.graph.initializers.values())


def is_fused(model: ir.Model) -> bool:
    return MHA in op_counts(model)


def sam_like(model: ir.Model) -> float:
    """What the H200 showed for SAM: fused attention is slower in float32 and faster in float16."""
    return {(False, False): 10.0, (False, True): 12.0, (True, False): 8.0, (True, True): 5.0}[
        (is_half(model), is_fused(model))]


class FakeTimer:
    """Stands in for bench.compare: each model's time is `cost(model)` (`final` in the last round,
    the one comparing tuned, default and input); every call and the models it was shown are kept."""

    def __init__(self, cost, final=None):
        self.cost, self.final = cost, final or cost
        self.calls: list[dict] = []

    def __call__(self, models, target, *, baseline=None, **kw):
        cost = self.final if "tuned" in models else self.cost
        times = {name: float(cost(m)) for name, m in models.items()}
        self.calls.append({"models": dict(models), "times": times, "label": kw.get("label")})
        base = baseline or next(iter(models))
        return {"provider": "FakeExecutionProvider", "baseline": base, "models": {
            name: {"latency_ms": {"median": t, "min": t, "p90": t}, "ratio_median": t / times[base], "copies": 0}
            for name, t in times.items()}}

    @property
    def option_rounds(self) -> list[dict]:
        return [c for c in self.calls if "tuned" not in c["models"]]

    @property
    def final_round(self) -> dict:
        (final,) = [c for c in self.calls if "tuned" in c["models"]]
        return final


def fake_timer(monkeypatch, cost, final=None) -> FakeTimer:
    timer = FakeTimer(cost, final)
    monkeypatch.setattr(bench, "compare", timer)
    return timer


def choice(result, option):
    (found,) = [c for c in result.report.choices if c["option"] == option]
    return found


def test_pending_options():
    plain = PassContext(target="cpu", engine=EngineSettings(tune=False))
    assert tune.pending(Fp16Pass(plain), plain) == []  # fp16 defaults to off, not auto
    tuning = PassContext(target="cpu", engine=EngineSettings(tune=True))
    assert [o.name for o in tune.pending(Fp16Pass(tuning), tuning)] == ["fp16"]
    user_set = PassContext(target="cpu", options={"fp16": True}, engine=EngineSettings(tune=True))
    assert tune.pending(Fp16Pass(user_set), user_set) == []  # what the user set is kept
    auto = PassContext(target="cpu", options={"fp16": "auto"}, engine=EngineSettings(tune=False))
    assert [o.name for o in tune.pending(Fp16Pass(auto), auto)] == ["fp16"]


NOT_HERE = "not timed: the provider is not here"


@pytest.mark.parametrize("option, setting, tuning, runnable, expected", [
    ("keep_io_types", False, True, True, ("user", None)),                 # 1. not tunable
    ("attention", "keep", True, True, ("user", None)),                    # 1. set by the user
    ("attention", "auto", False, True, ("timed", None)),                  # 2. set to auto
    ("attention", "auto", False, False, ("default", NOT_HERE)),           # 2. nothing can run
    ("fp16", None, True, True, ("timed", None)),                          # 3. unset, --tune, default off
    ("attention", None, True, False, ("default", NOT_HERE)),              # 3. nothing can run
    ("attention", None, False, True, ("default", tune.LEFT_AT_AUTO)),     # 4. unset at auto, no --tune
    ("attention", None, False, False, ("default", NOT_HERE)),             # 4. nothing can run
    ("fp16", None, False, True, ("user", None)),                          # 5. unset, default not auto
])
def test_one_place_decides_timed_default_or_the_user_s_value(option, setting, tuning, runnable, expected):
    cls = AttentionPass if option == "attention" else Fp16Pass
    p = cls(PassContext(target="cpu", options={option: setting}))
    opt = p.own_options.option(option)
    decision = tune.decide(opt, p, tune=tuning, not_runnable=None if runnable else NOT_HERE)
    assert (decision.how, decision.why) == expected
    assert decision.pending == (expected[0] != "user")


def test_candidates_of_a_bool_option_are_off_then_on():
    assert tune.candidates(fp16_option()) == [False, True]


def test_fp16_uses_float16_tolerances_unless_given():
    half = DEFAULT_TOLERANCES["float16"]
    assert tune.validation_tolerances("float16", None, None) == half
    assert tune.validation_tolerances("float16", 0.5, None) == (0.5, half[1])
    assert tune.validation_tolerances("float32", None, None) == (None, None)


# -- defaults per precision -------------------------------------------------------------------

def test_the_attention_default_for_cuda_depends_on_the_precision():
    opt = attention_option()
    assert opt.default_for("cuda", "float32") == "keep" and opt.default_for("cuda", "float16") == "fuse"
    assert opt.default_for("dml", "float32") == opt.default_for("dml", "float16") == "fuse"
    assert opt.default_for("cpu", "float16") == "keep"
    assert "--target cuda in float16" in opt.default_provenance("cuda", "float16")
    assert "measured" in opt.default_provenance("cuda", "float32")
    assert opt.default_provenance("cpu", "float32") == "the documented default for --target cpu"
    assert fp16_option().default_provenance("cuda") == "the option's default"
    # A pass run outside the pipeline resolves 'auto' the same way.
    half = AttentionPass(PassContext(target="cuda", precision="float16"))
    assert half.resolved_option("attention") == "fuse"
    assert AttentionPass(PassContext(target="cuda")).resolved_option("attention") == "keep"


@pytest.mark.skipif(runtime.has_target("cuda"), reason="the CUDA provider is here: auto would measure")
@pytest.mark.parametrize("fp16, expected", [(False, "keep"), (True, "fuse")])
def test_untimed_defaults_follow_the_precision_written(attention_model, fp16, expected):
    result = dmlopt.optimize(attention_model, target="cuda", fp16=fp16)
    assert result.passed
    record = choice(result, "attention")
    precision = "float16" if fp16 else "float32"
    assert record["choice"] == expected and record["precision"] == precision
    assert record["how"].startswith("not timed") and f"--target cuda in {precision}" in record["default_from"]
    assert "measured on an H200" in record["default_from"]
    assert is_fused(result.model) == (expected == "fuse")


# -- candidates timed as written --------------------------------------------------------------

def test_candidates_are_timed_as_written_in_float16(monkeypatch, attention_model):
    timer = fake_timer(monkeypatch, sam_like)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, attention="auto", retime=False)
    assert result.passed
    (attention_round,) = timer.option_rounds
    assert set(attention_round["models"]) == {"fuse", "keep"}
    # Every model the timer was shown, candidates and final round, is the whole pipeline's float16 output.
    assert all(is_half(m) for call in timer.calls for m in call["models"].values())
    assert is_fused(attention_round["models"]["fuse"]) and not is_fused(attention_round["models"]["keep"])
    record = choice(result, "attention")
    assert record["choice"] == "fuse" and record["precision"] == "float16"
    assert {c: m["precision"] for c, m in record["candidates"].items()} == {"fuse": "float16", "keep": "float16"}
    assert record["candidates"]["fuse"]["median_ms"] == 5.0 and record["candidates"]["keep"]["median_ms"] == 8.0
    assert "in float16" in record["how"]
    assert is_fused(result.model) and is_half(result.model)


def test_an_option_left_at_auto_takes_its_default_untimed_without_tune(monkeypatch, attention_model):
    """Only an explicit `auto` or --tune measures: a plain optimize on the target times no candidates."""
    timer = fake_timer(monkeypatch, sam_like)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, retime=False)
    assert result.passed and timer.calls == []
    record = choice(result, "attention")
    assert record["how"].startswith("the documented default, not timed") and record["candidates"] == {}
    assert record["choice"] == attention_option().default_for("cpu", "float16") == "keep"  # timing says fuse


def test_the_tuner_s_choice_does_not_overwrite_the_user_s_setting(monkeypatch, attention_model):
    """The user's "auto" stays the user's setting; the timed choice is the engine's, and the report shows both."""
    fake_timer(monkeypatch, sam_like)
    seen = []
    call = AttentionPass.call

    def spy(self, model):
        seen.append(self.own_options)
        return call(self, model)

    monkeypatch.setattr(AttentionPass, "call", spy)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, attention="auto", retime=False)
    assert result.passed
    written = seen[-1]  # the run that wrote the output
    assert written.settings == {"attention": "auto"} and written["attention"] == "fuse"
    assert written.resolved_by("attention") == "engine"
    assert all(dict(s.settings) == {"attention": "auto"} for s in seen)  # every candidate kept the setting
    assert result.report.options == {"fp16": True, "attention": "auto", "tune": False}
    assert choice(result, "attention")["choice"] == "fuse"
    report = result.report.to_dict()
    assert report["options"]["attention"] == "auto"
    assert [c["choice"] for c in report["choices"] if c["option"] == "attention"] == ["fuse"]


def test_with_tune_the_precision_is_decided_first(monkeypatch, attention_model):
    timer = fake_timer(monkeypatch, sam_like)
    result = dmlopt.optimize(attention_model, target="cpu", tune=True, retime=False)
    assert result.passed
    first, *rest = timer.option_rounds
    assert set(first["models"]) == {"False", "True"}  # fp16 before attention, though it runs last
    assert [is_half(first["models"][c]) for c in ("False", "True")] == [False, True]
    fp16 = choice(result, "fp16")
    assert fp16["choice"] is True
    assert {c: m["precision"] for c, m in fp16["candidates"].items()} == {"False": "float32", "True": "float16"}
    attention = choice(result, "attention")
    assert attention["choice"] == "fuse" and attention["precision"] == "float16"
    assert all(m["precision"] == "float16" for m in attention["candidates"].values())
    assert is_fused(result.model) and is_half(result.model)


def test_a_candidate_that_fails_validation_is_rejected(monkeypatch, model):
    fake_timer(monkeypatch, lambda m: 1.0 if is_half(m) else 2.0)
    result = dmlopt.optimize(model, target="cpu", passes=["fp16"], tune=True, atol=0.0, rtol=0.0, retime=False)
    record = choice(result, "fp16")
    assert record["choice"] is False
    assert record["rejected"] == {"True": "failed validation"}
    assert set(record["candidates"]) == {"False"}
    assert not is_half(result.model) and result.passed


def test_nothing_is_timed_when_no_choice_changes_the_graph(monkeypatch):
    timer = fake_timer(monkeypatch, lambda m: 1.0)
    ints = ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (int64[2] x) => (int64[2] y) { y = Add(x, x) }""")
    result = dmlopt.optimize(ints, target="cpu", passes=["fp16"], tune=True, retime=False)
    record = choice(result, "fp16")
    assert record["choice"] is False and record["candidates"] == {}
    assert record["how"].startswith("not timed")
    assert timer.calls == []  # no final round either: nothing was tuned


# -- the final comparison ---------------------------------------------------------------------

def test_the_final_round_keeps_the_default_when_the_tuned_output_measures_slower(monkeypatch, attention_model):
    # The option round (noise, say) found fusing faster; the final round finds the default faster.
    timer = fake_timer(monkeypatch, sam_like, final=lambda m: 9.0 if is_fused(m) else 8.0)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, tune=True, retime=False)
    assert result.passed
    final = timer.final_round
    assert set(final["models"]) == {"tuned", "default", "input"}
    assert is_fused(final["models"]["tuned"]) and not is_fused(final["models"]["default"])
    assert all(is_half(m) for m in final["models"].values())  # the input too: the user asked for float16
    assert not is_fused(result.model) and is_half(result.model)
    result_record = choice(result, "result")
    assert result_record["pass"] == "pipeline" and result_record["choice"] == "default"
    record = choice(result, "attention")
    assert record["choice"] == "keep" and "untuned default" in record["overruled"]


def test_the_final_round_keeps_the_input_when_every_rewrite_measures_slower(monkeypatch, attention_model):
    before = op_counts(attention_model)
    timer = fake_timer(monkeypatch, sam_like, final=lambda m: 9.0 if op_counts(m) != before else 8.0)
    result = dmlopt.optimize(attention_model, target="cpu", tune=True, retime=False)
    assert result.passed
    assert choice(result, "result")["choice"] == "input"
    assert timer.final_round["models"]["input"] is not None
    assert op_counts(result.model) == before and not result.report.passes  # no pass ran on the output
    assert "input" in choice(result, "attention")["overruled"]


def test_without_tune_the_final_round_compares_with_the_default_only(monkeypatch, attention_model):
    # `auto` measured on a run without --tune: the passes always run, the input is no candidate.
    timer = fake_timer(monkeypatch, sam_like, final=lambda m: 9.0 if is_fused(m) else 8.0)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, attention="auto", retime=False)
    assert set(timer.final_round["models"]) == {"tuned", "default"}
    assert choice(result, "result")["choice"] == "default" and not is_fused(result.model)
    assert [p["name"] for p in result.report.passes if p["name"] == "attention"] == ["attention"]


def test_a_tie_within_noise_goes_to_the_tuned_output(monkeypatch, attention_model):
    fake_timer(monkeypatch, sam_like, final=lambda m: 5.05 if is_fused(m) else 5.0)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, attention="auto", retime=False)
    assert choice(result, "result")["choice"] == "tuned" and is_fused(result.model)


@pytest.mark.parametrize("seed", range(4))
def test_the_written_model_is_the_fastest_of_the_final_round(monkeypatch, attention_model, seed):
    rng = random.Random(seed)  # noise: every call draws new times, the rounds disagree
    timer = fake_timer(monkeypatch, lambda m: rng.uniform(1, 10))
    result = dmlopt.optimize(attention_model, target="cpu", tune=True, retime=False)
    assert result.passed
    final = timer.final_round
    winner = choice(result, "result")["choice"]
    assert final["times"][winner] <= min(final["times"].values()) * (1 + tune.NOISE)
    written = final["models"][winner]
    assert op_counts(result.model) == op_counts(written) and is_half(result.model) == is_half(written)


# -- nothing is run without validation --------------------------------------------------------

def test_no_validate_runs_nothing(monkeypatch, attention_model):
    def no_session(*args, **kwargs):
        raise AssertionError("a model was run under --no-validate")

    monkeypatch.setattr(runtime, "session", no_session)
    result = dmlopt.optimize(attention_model, target="cpu", validate=False, attention="auto")
    record = choice(result, "attention")
    assert record["choice"] == "keep" and record["candidates"] == {}
    assert record["how"].startswith("not timed: --no-validate runs nothing")
    assert result.report.validation is None and result.report.timing is None


def test_cli_tune_with_no_validate_is_a_usage_error(cli, model_path, tmp_path):
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--tune", "--no-validate", "--target", "cpu")
    assert r.code == 2
    assert r.err.count("\n") == 1 and "--tune" in r.err and "--no-validate" in r.err
    assert not (tmp_path / "out.onnx").exists()


# -- measured for real ------------------------------------------------------------------------

def test_optimize_tune_records_every_candidate(model):
    result = dmlopt.optimize(model, target="cpu", passes=["fp16"], tune=True, retime=False)
    assert result.passed
    record = choice(result, "fp16")
    assert record["pass"] == "fp16"
    assert set(record["candidates"]) == {"False", "True"}
    assert record["how"].startswith("measured on CPUExecutionProvider")
    for c in record["candidates"].values():
        assert c["median_ms"] > 0 and c["min_ms"] <= c["median_ms"] <= c["p90_ms"]
    assert record["candidates"]["False"]["max_rel_error"] == 0.0
    assert record["candidates"]["True"]["max_rel_error"] > 0.0  # float16 really ran
    # The written model is the result round's winner: float16 initializers exactly when that is fp16.
    winner = choice(result, "result")["choice"]
    assert is_half(result.model) == (winner != "input" and record["choice"] is True)


def test_optimize_retimes_when_the_target_is_here(model):
    result = dmlopt.optimize(model, target="cpu", passes=["cleanup"])
    t = result.report.timing
    assert t["provider"] == "CPUExecutionProvider"
    assert {"before_ms", "after_ms", "speedup", "runs"} <= set(t)
    assert "timing on CPUExecutionProvider" in result.report.to_table()
    assert dmlopt.optimize(model, target="cpu", passes=["cleanup"], retime=False).report.timing is None


@pytest.mark.skipif(runtime.has_target("dml"), reason="DirectML is present here")
def test_tune_for_an_absent_target_fails_before_any_work(tmp_path):
    # The model path does not exist: a ProviderError (not an InputError) shows the check came first.
    with pytest.raises(ProviderError, match="providers present: .*CPUExecutionProvider"):
        dmlopt.optimize(tmp_path / "missing.onnx", target="dml", tune=True)
    with pytest.raises(ProviderError, match="DmlExecutionProvider"):
        dmlopt.optimize(tmp_path / "missing.onnx", target="dml", retime=True)


@pytest.mark.skipif(runtime.has_target("dml"), reason="DirectML is present here")
def test_cli_tune_without_the_target_is_exit_2(cli, model_path, tmp_path):
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--tune", "--target", "dml")
    assert r.code == 2
    assert "--tune needs the DmlExecutionProvider" in r.err and "CPUExecutionProvider" in r.err
    assert not (tmp_path / "out.onnx").exists()


def test_cli_fp16_flag_and_json_report(cli, model_path, tmp_path):
    report = tmp_path / "r.json"
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--target", "cpu", "--fp16", "--passes", "fp16",
            "--shape", "x:1,3,8,8", "--report", report)
    assert r.code == 0, r.err
    rep = json.loads(report.read_text())
    assert rep["options"]["fp16"] is True
    assert rep["passes"][0]["name"] == "fp16" and rep["passes"][0]["op_delta"] == {"Cast": 2}
    assert rep["validation"]["passed"] and rep["validation"]["outputs"][0]["atol"] == DEFAULT_TOLERANCES["float16"][0]


def test_a_choice_that_breaks_the_model_is_rejected_not_fatal(monkeypatch, attention_model):
    call = AttentionPass.call

    def broken_fuse(self, model):
        result = call(self, model)
        if self.option("attention") == "fuse":
            next(iter(model.graph)).attributes["perm"] = ir.AttrInt64s("perm", [9])  # an invalid attribute
        return result

    monkeypatch.setattr(AttentionPass, "call", broken_fuse)
    fake_timer(monkeypatch, sam_like)
    result = dmlopt.optimize(attention_model, target="cpu", fp16=True, attention="auto", retime=False)
    assert result.passed and not is_fused(result.model)
    record = choice(result, "attention")
    assert record["choice"] == "keep" and record["rejected"]["fuse"].startswith("invalid model: pass 'attention'")


def test_the_preferred_result_stays_unless_another_is_clearly_faster():
    def timed(ratio, median):
        return {"ratio_median": ratio, "latency_ms": {"median": median}}

    # By the ratio the input is 5% faster, but its median latency is not: no clear difference.
    assert tune._fastest({"tuned": timed(1.0, 0.77), "input": timed(0.95, 0.80)}, ["tuned", "input"]) == "tuned"
    # Faster by both measures beyond noise: the input wins.
    assert tune._fastest({"tuned": timed(1.0, 0.80), "input": timed(0.95, 0.76)}, ["tuned", "input"]) == "input"
    # Among several within noise, the first preferred.
    models = {"tuned": timed(1.01, 1.0), "default": timed(1.0, 1.0), "input": timed(1.0, 1.0)}
    assert tune._fastest(models, ["tuned", "default", "input"]) == "tuned"


def test_candidates_that_leave_the_graph_alone_are_built_once(monkeypatch, model):
    # Two strategies made to decline: with keep, three candidates leave the graph alone and share one output.
    from dmlopt.passes.leaky_relu import LeakyReluPass

    call = LeakyReluPass.call

    def declining(self, m):
        if self.option("leaky_relu") in ("relu-split", "channel-fold"):
            return ir.passes.PassResult(m, False)
        return call(self, m)

    monkeypatch.setattr(LeakyReluPass, "call", declining)
    timer = fake_timer(monkeypatch, lambda m: 1.0 if "LeakyRelu" in op_counts(m) else 2.0)
    result = dmlopt.optimize(model, target="cpu", passes=["leaky-relu"], leaky_relu="auto", retime=False)
    record = choice(result, "leaky_relu")
    (leaky_round,) = timer.option_rounds
    assert set(leaky_round["models"]) == {"keep", "decompose", "conv-split"}
    assert record["same_output"] == {"relu-split": "keep", "channel-fold": "keep"}
    assert record["choice"] == "keep"
