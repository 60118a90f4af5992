"""Pass options: each name belongs to one pass (the flat CLI flags and keywords stay unambiguous),
and the engine's own settings live apart from them."""

from __future__ import annotations

import argparse
import inspect

import pytest

import dmlopt
from dmlopt import cli, pipeline
from dmlopt.passes import DmlPass, EngineSettings, Option, PassContext, all_passes, check_unique_options
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
    context = PassContext(options={"leaky_relu": "decompose", "fp16": True})
    assert LeakyReluPass(context).option_values() == {"leaky_relu": "decompose"}
    assert Fp16Pass(context).option_values()["fp16"] is True
    assert "leaky_relu" not in Fp16Pass(context).option_values()


def test_tune_is_an_engine_setting_and_the_report_keeps_its_options_keys(monkeypatch):
    seen = []
    call = LeakyReluPass.call

    def spy(self, model):
        seen.append(self.context)
        return call(self, model)

    monkeypatch.setattr(LeakyReluPass, "call", spy)
    result = dmlopt.optimize(conv_leaky_model(), target="cpu", passes=["leaky-relu"], leaky_relu="decompose",
                             retime=False)
    assert seen and all(c.engine == EngineSettings(tune=False) and "tune" not in c.options for c in seen)
    assert result.report.options == {"leaky_relu": "decompose", "tune": False}
    assert result.report.to_dict()["options"] == {"leaky_relu": "decompose", "tune": False}
