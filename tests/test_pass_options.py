"""Pass options: each name belongs to one pass (the flat CLI flags and keywords stay unambiguous),
values are typed and checked once in a store keyed by pass name, the engine's choices are kept
apart from the user's settings, and the engine's own settings live apart from both."""

from __future__ import annotations

import argparse
import inspect

import pytest

import dmlopt
from dmlopt.cli import commands as cli
from dmlopt.engine import pipeline
from dmlopt.errors import UsageError
from dmlopt.passes import (DmlPass, EngineSettings, Option, OptionStore, PassContext, all_passes,
                           check_unique_options)
from dmlopt.passes.fp16 import Fp16Pass
from dmlopt.passes.leaky_relu import LeakyReluPass
from tests.conftest import conv_leaky_model


def _pass(name: str, *option_names: str) -> type[DmlPass]:
    options = tuple(Option(n, "keep", "a test option") for n in option_names)
    return type(f"Pass_{name}", (DmlPass,), {"name": name, "options": options})


def test_a_repeated_option_name_is_refused_at_load():
    with pytest.raises(TypeError, match="passes 'a' and 'b' both declare option 'mode'.*--mode"):
        check_unique_options([_pass("a", "mode", "x"), _pass("b", "y", "mode")])
    check_unique_options([_pass("a", "x"), _pass("b", "y")])  # distinct names load


def test_a_store_refuses_a_name_two_passes_declare():
    """Keyed by pass name, the store could hold both; the flat keyword could not say which one it sets."""
    with pytest.raises(TypeError, match="passes 'a' and 'b' both declare option 'mode'"):
        OptionStore.build([_pass("a", "mode"), _pass("b", "mode")], {"mode": "keep"})
    store = OptionStore.build([_pass("a", "mode"), _pass("b", "other")], {"mode": "keep"})
    assert store.settings() == {"a": {"mode": "keep"}}


def test_values_are_typed_once_when_the_store_is_built():
    store = pipeline.check_options({"fp16_repair_runs": "5", "fp16": "off", "fp16_keep_nodes": ["a,b", "c"],
                                    "leaky_relu": "decompose", "attention": None})
    fp16 = store.of(Fp16Pass)
    assert fp16["fp16_repair_runs"] == 5 and fp16["fp16"] is False and fp16["fp16_keep_nodes"] == ("a,b", "c")
    assert store.settings() == {"fp16": {"fp16_repair_runs": 5, "fp16": False, "fp16_keep_nodes": ("a,b", "c")},
                                "leaky-relu": {"leaky_relu": "decompose"}}  # None: unset
    assert store.of(Fp16Pass)["keep_io_types"] is True  # unset: the declared default


@pytest.mark.parametrize("options, message", [
    ({"fp16_repair_runs": "many"}, "--fp16-repair-runs: 'many' is not an integer"),
    ({"fp16_repair_runs": True}, "--fp16-repair-runs: 'True' is not an integer"),
    ({"keep_io_types": "maybe"}, "--keep-io-types: 'maybe' is not true or false"),
    ({"fp16_keep_ops": 3}, "--fp16-keep-ops: '3' is not text"),
    ({"leaky_relu": "sideways"}, "--leaky-relu: 'sideways' is not one of "),
    ({"no_such_option": 1}, "unknown option 'no_such_option' \\(known: "),
])
def test_a_bad_value_is_a_one_line_usage_error_before_any_pass_runs(options, message, monkeypatch):
    monkeypatch.setattr(LeakyReluPass, "call", lambda self, model: pytest.fail("a pass ran"))
    with pytest.raises(UsageError, match=message) as caught:
        dmlopt.optimize(conv_leaky_model(), target="cpu", retime=False, **options)
    assert "\n" not in str(caught.value)


def test_a_pass_run_alone_takes_its_own_values_from_a_mapping_typed():
    context = PassContext(options={"fp16_repair_runs": "7", "leaky_relu": "decompose"})
    assert Fp16Pass(context).option("fp16_repair_runs") == 7
    with pytest.raises(UsageError, match="--leaky-relu: 'x' is not one of"):
        LeakyReluPass(PassContext(options={"leaky_relu": "x"}))


def test_the_engine_s_choices_stay_apart_from_the_user_s_settings():
    store = pipeline.check_options({"attention": "auto", "fp16": True})
    chosen = store.with_choices({"attention": {"attention": "fuse"}, "fp16": {"fp16_keep_nodes": ("n1",)}})
    assert store.of(all_passes()["attention"])["attention"] == "auto"  # the store it came from is unchanged
    attention = chosen.of(all_passes()["attention"])
    assert attention["attention"] == "fuse" and attention.settings == {"attention": "auto"}
    assert attention.resolved_by("attention") == "engine"
    assert chosen.settings() == store.settings() == {"attention": {"attention": "auto"}, "fp16": {"fp16": True}}
    assert chosen.choices() == {"attention": {"attention": "fuse"}, "fp16": {"fp16_keep_nodes": ("n1",)}}
    fp16 = chosen.of(Fp16Pass)
    assert [fp16.resolved_by(n) for n in ("fp16", "fp16_keep_nodes", "keep_io_types")] == ["user", "engine", "default"]
    with pytest.raises(UsageError, match="--attention: 'sideways' is not one of"):
        store.chose("attention", "attention", "sideways")  # a choice is checked as a setting is


def test_the_registered_passes_declare_each_option_once():
    owners = [opt.name for cls in all_passes().values() for opt in cls.options]
    assert len(owners) == len(set(owners)) and owners
    assert set(pipeline.pass_options()) == set(owners)


def test_an_option_named_like_an_engine_setting_is_refused(monkeypatch):
    monkeypatch.setattr(pipeline, "all_passes", lambda: {"a": _pass("a", "tune")})
    with pytest.raises(TypeError, match="pass 'a' declares option 'tune'"):
        pipeline.pass_options()


def test_engine_keywords_cover_optimize_and_its_cli_flags():
    keywords = set(inspect.signature(dmlopt.optimize).parameters)
    assert keywords <= pipeline.ENGINE_KEYWORDS
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    own = [a for a in sub.choices["optimize"]._actions if not a.dest.startswith("opt_")]
    flags = {s[2:].replace("-", "_") for a in own for s in a.option_strings if s.startswith("--")} - {"help"}
    assert flags <= pipeline.ENGINE_KEYWORDS  # so pass_options refuses a pass option that would clash
    assert not flags & set(pipeline.pass_options())


def test_a_pass_sees_only_its_own_options():
    for context in (PassContext(options={"leaky_relu": "decompose", "fp16": True}),
                    PassContext(options=pipeline.check_options({"leaky_relu": "decompose", "fp16": True}))):
        assert LeakyReluPass(context).option_values() == {"leaky_relu": "decompose"}
        assert Fp16Pass(context).option_values()["fp16"] is True
        assert "leaky_relu" not in Fp16Pass(context).option_values()
        with pytest.raises(KeyError, match="leaky-relu has no option 'fp16'"):
            LeakyReluPass(context).option("fp16")


def test_tune_is_an_engine_setting_and_the_report_keeps_its_options_keys(monkeypatch):
    seen = []
    call = LeakyReluPass.call

    def spy(self, model):
        seen.append(self.context)
        return call(self, model)

    monkeypatch.setattr(LeakyReluPass, "call", spy)
    result = dmlopt.optimize(conv_leaky_model(), target="cpu", passes=["leaky-relu"], leaky_relu="decompose",
                             retime=False)
    assert seen and all(c.engine == EngineSettings(tune=False) for c in seen)
    assert all(c.options.settings() == {"leaky-relu": {"leaky_relu": "decompose"}} for c in seen)
    assert result.report.options == {"leaky_relu": "decompose", "tune": False}
    assert result.report.to_dict()["options"] == {"leaky_relu": "decompose", "tune": False}
