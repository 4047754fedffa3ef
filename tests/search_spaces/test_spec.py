from __future__ import annotations

import math

import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from search_spaces import SpaceError, builtin_space_names, load_space, parse_space


def space(params: dict, **top) -> dict:
    return {"name": "s", "params": params, **top}


GOOD = [
    ({"type": "float", "low": 0.001, "high": 0.3, "log": True}, FloatDistribution(0.001, 0.3, log=True)),
    ({"type": "float", "low": 0, "high": 1, "step": 0.25}, FloatDistribution(0.0, 1.0, step=0.25)),
    ({"type": "int", "low": 0, "high": 400, "step": 20}, IntDistribution(0, 400, step=20)),
    ({"type": "int", "low": 1, "high": 64, "log": True}, IntDistribution(1, 64, log=True)),
    ({"type": "categorical", "choices": ["embedding_only", "full"]},
     CategoricalDistribution(["embedding_only", "full"])),
    ({"type": "categorical", "choices": [1, 2.5, None]}, CategoricalDistribution([1, 2.5, None])),
]


@pytest.mark.parametrize("spec,expected", GOOD)
def test_good_param_becomes_distribution(spec, expected):
    parsed = parse_space(space({"p": spec}), source="f.yaml")
    assert parsed.distributions() == {"p": expected}


BAD = [
    # (document, key named in the message, value named in the message)
    ([1, 2], "<top>", "'list'"),
    (space({"p": {"type": "float", "low": 0, "high": 1}}, extra=1), "extra", "1"),
    ({"params": {"p": {"type": "int", "low": 0, "high": 1}}}, "name", "None"),
    (space({}), "params", "{}"),
    (space({"p": {"type": "uniform", "low": 0, "high": 1}}), "params.p.type", "'uniform'"),
    (space({"p": {"type": "float", "low": 2.0, "high": 1.0}}), "params.p.low", "2.0"),
    (space({"p": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}), "params.p.low", "0.0"),
    (space({"p": {"type": "float", "low": -1.0, "high": 1.0, "log": True}}), "params.p.low", "-1.0"),
    (space({"p": {"type": "float", "low": "a", "high": 1.0}}), "params.p.low", "'a'"),
    (space({"p": {"type": "float", "high": 1.0}}), "params.p.low", "None"),
    (space({"p": {"type": "int", "low": 0.5, "high": 3}}), "params.p.low", "0.5"),
    (space({"p": {"type": "int", "low": 0, "high": 3, "step": 0}}), "params.p.step", "0"),
    (space({"p": {"type": "float", "low": 0.1, "high": 3, "step": 0.1, "log": True}}), "params.p.step", "0.1"),
    (space({"p": {"type": "float", "low": 0, "high": 3, "log": "yes"}}), "params.p.log", "'yes'"),
    (space({"p": {"type": "categorical", "choices": []}}), "params.p.choices", "[]"),
    (space({"p": {"type": "categorical", "choices": ["a", "a"]}}), "params.p.choices", "['a', 'a']"),
    (space({"p": {"type": "categorical", "choices": ["a"], "low": 0}}), "params.p.low", "0"),
    (space({"p": {"type": "float", "low": 0, "high": 1, "choices": [1]}}), "params.p.choices", "[1]"),
    (space({"p": {"type": "float", "low": 0, "high": 1}}, trials=0), "trials", "0"),
    (space({"p": {"type": "float", "low": 0, "high": 1}}, fixed={"p": 3}), "fixed.p", "3"),
    (space({"p": {"type": "float", "low": 0, "high": 1}}, hypotheses=[{"x": "p", "y": "q", "law": "power"}]),
     "hypotheses[0].y", "'q'"),
    (space({"p": {"type": "float", "low": 0, "high": 1}, "q": {"type": "float", "low": 0, "high": 1}},
           hypotheses=[{"x": "p", "y": "q", "law": "cubic"}]), "hypotheses[0].law", "'cubic'"),
]


@pytest.mark.parametrize("doc,key,value", BAD)
def test_bad_field_names_file_key_and_value(doc, key, value):
    with pytest.raises(SpaceError) as info:
        parse_space(doc, source="bad.yaml")
    message = str(info.value)
    assert message.startswith("bad.yaml: ")
    assert f"{key}={value}" in message
    assert "\n" not in message


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nparams:\n  p: {type: float, low: 0\n")
    with pytest.raises(SpaceError, match=r"broken.yaml: malformed YAML at line \d+"):
        load_space(str(path))


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("name: !!python/object/apply:os.system ['echo pwned']\nparams: {}\n")
    with pytest.raises(SpaceError, match="malformed YAML"):
        load_space(str(path))


def test_unknown_space_lists_builtins():
    with pytest.raises(SpaceError, match="built-ins: .*warmup_init"):
        load_space("no_such_space")


@pytest.mark.parametrize("name", builtin_space_names())
def test_builtin_spaces_are_valid_and_roundtrip(name):
    s = load_space(name)
    assert s.description and s.trials and s.params
    again = parse_space(yaml.safe_load(yaml.safe_dump(s.to_dict())), source="roundtrip")
    assert again.distributions() == s.distributions()
    assert again.hypotheses == s.hypotheses


def test_warmup_init_declares_power_law():
    s = load_space("warmup_init")
    assert [(h.x, h.y, h.law) for h in s.hypotheses] == [("warmup_steps", "init_std", "power")]
    init_std = next(p for p in s.params if p.name == "init_std")
    assert init_std.log and init_std.low > 0 and math.isfinite(init_std.high)
