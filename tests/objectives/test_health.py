"""Training-health diagnostics and divergence-aware early stopping."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from objectives import HealthConfig, TrialStopped
from objectives._phase import classify_phase
from objectives import textual_inversion


@pytest.mark.parametrize("seed", range(5))
def test_phase_classifier_labels_synthetic_curves(seed):
    rng = np.random.default_rng(seed)
    t = np.arange(80)
    curves = {
        "converging": 0.3 + np.exp(-t / 20) + rng.normal(0, 0.05, 80),
        "flat": 0.25 + rng.normal(0, 0.08, 80),
        "oscillating": 0.25 + 0.1 * np.sin(t / 4) + rng.normal(0, 0.02, 80),
        "degrading": 0.25 + 0.01 * t + rng.normal(0, 0.05, 80),
    }
    assert {name: classify_phase(c)[0] for name, c in curves.items()} == {n: n for n in curves}


@pytest.mark.slow
def test_a_healthy_default_trial_is_ok():
    out = textual_inversion({"steps": 40})
    report = out["health"]
    assert report["health"] == "ok" and out["tags"]["health"] == "ok"
    assert report["dead_adapters"] == [] and report["stopped"] is None
    assert len(out["history"]["embed_norm"]) == 40 and len(out["history"]["grad_norm.embedding_0"]) == 40
    assert report["cos_sim_mean"] < 0.98 and out["embed_norm_max_ratio"] < 20
    assert json.loads(out["artifacts"]["health.json"])["health"] == "ok"


def test_huge_lr_is_stopped_within_bounded_steps_with_reason():
    with pytest.raises(TrialStopped) as info:
        textual_inversion({"steps": 200, "lr": 100.0})
    stop = info.value
    assert stop.step < 5 and stop.reason.startswith("diverged: concept-embedding norm")
    assert stop.partial["health"]["health"] == "diverged"
    assert len(stop.partial["history"]["train_loss"]) == stop.step + 1
    assert "health.json" in stop.partial["artifacts"]


def test_without_early_stop_the_diverging_trial_runs_out_and_is_labelled():
    out = textual_inversion({"steps": 12, "lr": 100.0}, health={"early_stop": False})
    assert len(out["history"]["train_loss"]) == 12
    assert out["health"]["health"] == "diverged"


def _monitor(cfg):
    from objectives._health import HealthMonitor

    z = torch.nn.Parameter(torch.ones(2, 4))
    return HealthMonitor(cfg, {"embedding_0": [z]}, {"concept_embedding_0": z}, lambda: [z], 1.0)


def test_sustained_degradation_stops_a_trial():
    """A loss that climbs steadily is stopped as `degrading` after `patience` checks in a row;
    a falling one with the same noise never is."""
    cfg = HealthConfig(max_norm_ratio=1e9, min_steps=20, check_every=5, patience=2, window=20)
    rng = np.random.default_rng(0)
    rising = list(1.0 + 0.02 * np.arange(120) + rng.normal(0, 0.01, 120))
    monitor = _monitor(cfg)
    with pytest.raises(TrialStopped) as info:
        for step in range(120):
            monitor.after_step(step, rising[: step + 1])
    assert info.value.reason.startswith("degrading: train_loss rose")
    assert info.value.step == 24  # checks at steps 20 and 25 (n = 20, 25): two in a row
    falling = list(3.0 - 0.02 * np.arange(120) + rng.normal(0, 0.01, 120))
    monitor = _monitor(cfg)
    for step in range(120):
        monitor.after_step(step, falling[: step + 1])
    assert monitor.finish(falling)["phase"] != "degrading"


def test_lora_missing_the_second_sdxl_encoder_is_flagged_dead(monkeypatch):
    """The classic SDXL script bug: encoder 2's LoRA and concept code are meant to train
    (requires_grad, gradients flow) but never reach the optimizer, so they never change."""
    import objectives._textual_inversion as ti

    real = ti.optimizer_groups  # train's own reference to it

    def forgets_encoder_2(trainables, cfg):
        second = {id(p) for p in trainables.of_encoder(1)}
        return [{**g, "params": [p for p in g["params"] if id(p) not in second]}
                for g in real(trainables, cfg)]

    monkeypatch.setattr(ti, "optimizer_groups", forgets_encoder_2)
    out = textual_inversion({"steps": 4, "lora_rank": 2, "lora_targets": "text"}, model="tiny-sdxl")
    report = out["health"]
    assert report["health"] == "dead_adapter" and out["tags"]["health"] == "dead_adapter"
    dead = report["dead_adapters"]
    assert "concept_embedding_1" in dead
    assert any(u.startswith("text_encoder_1.") and "self_attn" in u for u in dead)
    assert not any(u.startswith(("text_encoder_0.", "concept_embedding_0")) for u in dead)
    # gradients did reach encoder 2: the weights never moving is what gives it away
    assert max(out["history"]["grad_norm.text_encoder_1"]) > 0


def test_the_correct_sdxl_lora_run_has_no_dead_adapter():
    out = textual_inversion({"steps": 4, "lora_rank": 2, "lora_targets": "text"}, model="tiny-sdxl")
    assert out["health"]["dead_adapters"] == []


def test_health_settings_are_validated():
    with pytest.raises(ValueError, match="health setting 'bogus' is unknown"):
        HealthConfig.from_mapping({"bogus": 1})
    with pytest.raises(ValueError, match="max_norm_ratio must be a number > 0"):
        HealthConfig.from_mapping({"max_norm_ratio": -1})


@pytest.mark.slow
def test_gradient_health_per_module_is_in_health_json():
    out = textual_inversion({"steps": 12, "lora_rank": 2, "lora_targets": "both"},
                            health={"check_every": 5})
    per_module = json.loads(out["artifacts"]["health.json"])["grad_norm_per_module"]
    lora_units = [u for u in per_module if u.startswith("unet.") and u.endswith("to_q")]
    assert lora_units, sorted(per_module)[:5]
    rec = per_module[lora_units[0]]
    assert rec["step"] == [0, 5, 10] and len(rec["grad_norm"]) == 3 and rec["nonfinite"] == [0.0] * 3
    assert any(u.startswith("text_encoder_0.") for u in per_module) and "concept_embedding_0" in per_module
