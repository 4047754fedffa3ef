"""Each knob's mechanism, not just that it is accepted."""

from __future__ import annotations

import math

import pytest
import torch

from objectives import textual_inversion, train
from objectives._textual_inversion import cached_base_model
from objectives._trainables import (
    LORA_TEXT_TARGETS,
    LORA_UNET_TARGETS,
    ConceptEmbedding,
    _embeddings_module,
    _inner,
    token_rank_factors,
)

FAST = {"steps": 4, "lr": 1e-2}


def trained_parts(params: dict, model: str = "tiny") -> tuple[dict, dict]:
    run = train({**FAST, **params}, model=model)
    return run.result, {"text_encoders": run.text_encoders, "unet": run.unet, "base": run.base,
                        "concept_embeddings": run.trainables.concepts, "trainables": run.trainables}


# --- 2) token_weight_decay -----------------------------------------------------------------
def test_rank_factors_follow_first_occurrence():
    ids = torch.tensor([[1, 100, 5, 101, 100, 102, 2]])
    f = token_rank_factors(ids, first_id=100, decay=0.5)
    assert f.tolist() == [[1.0, 1.0, 1.0, 0.5, 1.0, 0.25, 1.0]]


@pytest.mark.parametrize("decay", [0.5, 0.1])
def test_token_weight_decay_scales_each_concept_gradient_exactly(decay):
    base = cached_base_model("tiny", "cpu")
    te, tok = base.text_encoder, base.tokenizer
    first = len(tok)
    emb = _embeddings_module(te)
    original = emb.token_embedding
    ids = torch.tensor([[tok.bos_token_id, first + 1, 320, first, tok.eos_token_id]])  # <b> a <a>
    weights = torch.randn(1, 5, te.config.hidden_size, generator=torch.Generator().manual_seed(0))
    grads = []
    for d in (1.0, decay):
        z = torch.randn(2, te.config.hidden_size, generator=torch.Generator().manual_seed(1))
        ce = ConceptEmbedding(original, first, z, None)
        ce.grad_scale = token_rank_factors(ids, first, d)
        emb.token_embedding = ce
        try:
            (te(ids)[0] * weights).sum().backward()
        finally:
            emb.token_embedding = original
        grads.append(ce.z.grad.clone())
    # token first+1 comes first in the prompt (k=0), token `first` second (k=1)
    assert torch.allclose(grads[1][1], grads[0][1])
    assert torch.allclose(grads[1][0], decay * grads[0][0], rtol=1e-5, atol=1e-8)
    assert grads[0][0].abs().sum() > 0


def test_synthetic_set_has_multi_concept_prompts():
    from objectives._data import synthetic_concepts

    concepts = synthetic_concepts(32)
    assert any(len(c) == 2 for _, c in concepts.train)
    assert any(len(c) == 2 for _, c in concepts.val)


# --- 3) freeze ------------------------------------------------------------------------------
def _changed(trained: torch.nn.Module, base: torch.nn.Module) -> dict[str, bool]:
    ref = dict(base.named_parameters())
    return {n: not torch.equal(p.detach(), ref[n].detach()) for n, p in trained.named_parameters()}


@pytest.mark.parametrize("mode,extra", [
    ("embedding_only", {}), ("attention_only", {}), ("top_layers", {"unfreeze_layers": 1}), ("full", {}),
])
def test_freeze_modes_train_exactly_their_set(mode, extra):
    out, box = trained_parts({"freeze": mode, **extra})
    te, base_te = box["text_encoders"][0], box["base"].text_encoders[0]
    changed = _changed(te, base_te)
    n_layers = len(_inner(base_te).encoder.layers)

    def in_set(name: str) -> bool:
        if "token_embedding" in name:
            return False
        if mode == "attention_only":
            return "self_attn" in name and any(f"{t}." in name for t in LORA_TEXT_TARGETS)
        if mode == "top_layers":
            return f"layers.{n_layers - 1}." in name
        return mode == "full"

    for name, moved in changed.items():
        if not in_set(name):
            assert not moved, f"{mode}: frozen {name} changed"
    trained = [n for n in changed if in_set(n)]
    assert (len(trained) > 0) == (mode != "embedding_only")
    assert sum(changed[n] for n in trained) == len(trained), f"{mode}: some of its set did not train"
    assert out["trainable_params_text"] == sum(p.numel() for n, p in te.named_parameters() if in_set(n))


@pytest.mark.slow
def test_peak_memory_orders_freeze_modes():
    mem = {m: textual_inversion({**FAST, "freeze": m})["peak_mem_mb"]
           for m in ("embedding_only", "attention_only", "full")}
    assert mem["embedding_only"] < mem["attention_only"] < mem["full"]


def test_top_layers_beyond_the_encoder_is_refused():
    with pytest.raises(ValueError, match="unfreeze_layers must be <="):
        textual_inversion({**FAST, "freeze": "top_layers", "unfreeze_layers": 99})


# --- 4) contrastive -------------------------------------------------------------------------
@pytest.mark.slow
def test_contrastive_off_at_weight_zero_and_costs_memory_when_on():
    plain = textual_inversion({**FAST, "seed": 5})
    zero = textual_inversion({**FAST, "seed": 5, "contrastive_weight": 0.0, "contrastive_margin": 1.0})
    on = textual_inversion({**FAST, "seed": 5, "contrastive_weight": 1.0, "contrastive_margin": 1.0})
    assert zero["val_loss"] == plain["val_loss"] and "contrastive" not in zero["history"]
    assert on["peak_mem_mb"] > plain["peak_mem_mb"]
    # with a margin far above any error gap, every different-concept pair contributes
    assert all(v > 0.5 for v in on["history"]["contrastive"])
    assert on["val_loss"] != plain["val_loss"]
    assert 0.0 <= on["concept_separation"] <= 1.0


# --- 5) LoRA --------------------------------------------------------------------------------
def _closed_form(module: torch.nn.Module, targets: list[str], rank: int, skip: str = "") -> int:
    total = 0
    for name, m in module.named_modules():
        if skip and skip in name:
            continue
        if isinstance(m, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += rank * (m.in_features + m.out_features)
    return total


@pytest.mark.parametrize("rank,targets", [(2, "unet"), (4, "text"), (8, "both")])
def test_lora_parameter_counts_equal_the_closed_form(rank, targets):
    out, box = trained_parts({"lora_rank": rank, "lora_targets": targets})
    base = box["base"]
    unet_expected = _closed_form(base.unet, LORA_UNET_TARGETS, rank) if targets != "text" else 0
    text_expected = _closed_form(base.text_encoder, LORA_TEXT_TARGETS, rank) if targets != "unet" else 0
    assert out["trainable_params_unet_lora"] == unet_expected
    assert out["trainable_params_text"] == text_expected
    assert unet_expected + text_expected > 0


@pytest.mark.slow
def test_peak_memory_grows_with_lora_rank():
    mem = [textual_inversion({**FAST, "lora_rank": r})["peak_mem_mb"] for r in (0, 2, 8)]
    assert mem[0] < mem[1] < mem[2]


def test_lora_alpha_defaults_to_rank():
    from objectives import resolve_params

    assert resolve_params({"lora_rank": 6})["lora_alpha"] == 6.0
    assert resolve_params({"lora_rank": 6, "lora_alpha": 3})["lora_alpha"] == 3.0


# --- 6) embedding_dim ------------------------------------------------------------------------
@pytest.mark.slow
def test_embedding_dim_below_hidden_trains_only_z():
    out, box = trained_parts({"embedding_dim": 8})
    ce = box["concept_embeddings"][0]
    n_tokens = 3
    assert tuple(ce.z.shape) == (n_tokens, 8)
    assert ce.z.requires_grad and not ce.proj.requires_grad
    assert out["trainable_params"] == n_tokens * 8
    proj = ce.proj
    assert torch.allclose(proj.T @ proj, torch.eye(8), atol=1e-5)
    rows = ce.rows().detach()
    assert torch.allclose(proj @ (proj.T @ rows.T), rows.T, atol=1e-5)  # the rows lie in span(P)
    hidden = box["base"].text_encoder.config.hidden_size
    plain = textual_inversion({**FAST, "embedding_dim": hidden})
    assert plain["trainable_params"] == n_tokens * hidden


def test_embedding_dim_above_hidden_is_refused():
    with pytest.raises(ValueError, match="embedding_dim must be <="):
        textual_inversion({**FAST, "embedding_dim": 4096})


# --- 7) embedding_lr_ratio, 8) clipping and precision -----------------------------------------
def test_embedding_lr_is_ratio_times_lr():
    out = textual_inversion({"steps": 3, "lr": 1e-2, "embedding_lr_ratio": 0.3, "lora_rank": 2})
    assert out["history"]["lr"] == pytest.approx([3e-3] * 3)


@pytest.mark.slow
def test_grad_clipping_changes_the_update():
    off = {"early_stop": False}
    a = textual_inversion({**FAST, "lr": 1.0, "seed": 2}, health=off)
    b = textual_inversion({**FAST, "lr": 1.0, "seed": 2, "max_grad_norm": 1e-4}, health=off)
    assert a["val_loss"] != b["val_loss"]


def test_fp16_is_refused_on_cpu():
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        textual_inversion({**FAST, "precision": "fp16"})


@pytest.mark.slow
def test_bf16_trains_with_fp32_trainables_and_less_memory():
    out, box = trained_parts({"precision": "bf16", "lora_rank": 2})
    assert all(p.dtype == torch.float32 for p in box["trainables"].named().values())
    assert next(box["base"].unet.parameters()).dtype == torch.bfloat16
    fp32 = textual_inversion({**FAST, "lora_rank": 2})
    assert out["peak_mem_mb"] < fp32["peak_mem_mb"]
    assert out["val_loss"] == pytest.approx(fp32["val_loss"], rel=0.05)


@pytest.mark.parametrize("freeze", ["full", "top_layers"])
def test_bf16_trains_the_freeze_modes_on_sdxls_encoders_and_leaves_the_base_in_bf16(freeze):
    """freeze full in bf16 on SDXL: the trained layers' fp32 stream runs into the first encoder's
    unused last layer, frozen, which stopped the first validation on the CPU ("mixed dtype
    (CPU)"); it now has fp32 weights of its own. The base model stays bf16 and as it was."""
    base = cached_base_model("tiny-sdxl", "cpu", "bf16")
    before = {(i, k): v.clone() for i, te in enumerate(base.text_encoders) for k, v in te.state_dict().items()}
    out, box = trained_parts({"precision": "bf16", "freeze": freeze, "unfreeze_layers": 1, "steps": 2},
                             model="tiny-sdxl")
    assert box["base"] is base and math.isfinite(out["val_loss"]) and out["val_loss"] < out["val_loss_init"] * 2
    after = {(i, k): v for i, te in enumerate(base.text_encoders) for k, v in te.state_dict().items()}
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, before[k]) for k, v in after.items() if v.is_floating_point())


# --- SDXL -----------------------------------------------------------------------------------
def test_sdxl_both_encoders_get_gradients_and_change():
    out, box = trained_parts({"lora_rank": 2, "lora_targets": "both", "steps": 3}, model="tiny-sdxl")
    base = box["base"]
    assert base.is_sdxl and len(box["text_encoders"]) == 2
    for i in (0, 1):
        assert min(out["history"][f"grad_norm.embedding_{i}"]) > 0
        assert min(out["history"][f"grad_norm.text_encoder_{i}"]) > 0
        lora_b = [p for n, p in box["text_encoders"][i].named_parameters() if "lora_B" in n]
        assert lora_b and all(p.detach().abs().sum() > 0 for p in lora_b), f"encoder {i} LoRA never trained"
        trainable = [p for p in box["text_encoders"][i].parameters() if p.requires_grad]
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in trainable)
    codes = [ce.z.detach() for ce in box["concept_embeddings"]]
    assert codes[0].shape[1] == base.text_encoders[0].config.hidden_size
    assert codes[1].shape[1] == base.text_encoders[1].config.hidden_size
    # SDXL conditions on the penultimate layer: the first encoder's last layer is not adapted
    last = f"layers.{len(_inner(base.text_encoders[0]).encoder.layers) - 1}."
    assert out["trainable_params_text"] == (
        _closed_form(base.text_encoders[0], LORA_TEXT_TARGETS, 2, skip=last)
        + _closed_form(base.text_encoders[1], LORA_TEXT_TARGETS, 2)
    )


def test_sdxl_full_unfreeze_trains_every_trainable_parameter():
    out, box = trained_parts({"freeze": "full", "steps": 2}, model="tiny-sdxl")
    for i, te in enumerate(box["text_encoders"]):
        ref = dict(box["base"].text_encoders[i].named_parameters())
        for name, p in te.named_parameters():
            moved = not torch.equal(p.detach(), ref[name].detach())
            assert moved == p.requires_grad, f"encoder {i} {name}: trainable={p.requires_grad} moved={moved}"


# --- the knobs trainers tune beside ours ------------------------------------------------------
def test_min_snr_weights_are_the_closed_form():
    from objectives._step import loss_weights

    sched = cached_base_model("tiny", "cpu").scheduler
    t = torch.tensor([0, 10, 100, 500, 999])
    ac = sched.alphas_cumprod[t].double()
    snr = ac / (1 - ac)
    expected = torch.minimum(snr, torch.tensor(5.0, dtype=torch.float64)) / snr
    assert torch.allclose(loss_weights(sched, t, 5.0).double(), expected, rtol=1e-5)
    assert torch.equal(loss_weights(sched, t, 0.0), torch.ones(5))
    # it weighs the low-noise (high-SNR) timesteps down, the high-noise ones not at all
    w = loss_weights(sched, t, 5.0)
    assert w[0] < 0.01 and w[-1] == pytest.approx(1.0)


def test_min_snr_changes_the_training_loss_not_the_validation_draws():
    plain, _ = trained_parts({})
    snr, _ = trained_parts({"min_snr_gamma": 5.0})
    assert plain["val_loss_init"] == snr["val_loss_init"]  # the same fixed validation
    assert snr["history"]["train_loss"] != plain["history"]["train_loss"]
    assert all(a <= b + 1e-9 for a, b in zip(snr["history"]["train_loss"], plain["history"]["train_loss"]))


def test_noise_offset_shifts_the_training_noise_per_sample_and_channel():
    seen = []
    from diffusers import DDPMScheduler

    original = DDPMScheduler.add_noise

    def spy(self, x, noise, t):
        seen.append(noise.detach().clone())
        return original(self, x, noise, t)

    DDPMScheduler.add_noise = spy
    try:
        trained_parts({"steps": 30, "noise_offset": 0.5})
        offset = torch.cat([n for n in seen if n.shape[0] == 4])  # the training batches
        seen.clear()
        trained_parts({"steps": 30})
        plain = torch.cat([n for n in seen if n.shape[0] == 4])
    finally:
        DDPMScheduler.add_noise = original
    # the per-(sample, channel) means: std sqrt(0.5^2 + 1/pixels) with the offset, 1/16 without
    m_off, m_plain = offset.mean(dim=(2, 3)).std(), plain.mean(dim=(2, 3)).std()
    assert 0.4 < float(m_off) < 0.6 and float(m_plain) < 0.1


def _moved(params: dict) -> float:
    """How far the first concept vector moved from its (seeded) start."""
    start = train({**FAST, "steps": 1, "lr": 1e-12}).trainables.concepts[0].z.detach()
    _, parts = trained_parts(params)
    return float((parts["concept_embeddings"][0].z.detach() - start).norm())


def test_caption_dropout_trains_the_concept_less():
    """A dropped caption is the empty prompt: no concept token, no gradient to its vector from
    that sample (the UNet's LoRA still learns from it)."""
    assert _moved({"steps": 8, "caption_dropout": 0.9}) < 0.8 * _moved({"steps": 8})


def test_gradient_checkpointing_lowers_memory_and_keeps_the_loss():
    plain, _ = trained_parts({"lora_rank": 4})
    ckpt, parts = trained_parts({"lora_rank": 4, "gradient_checkpointing": True})
    assert ckpt["peak_mem_mb"] < plain["peak_mem_mb"]
    assert ckpt["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)
    assert ckpt["history"]["train_loss"] == pytest.approx(plain["history"]["train_loss"], rel=1e-5)
    # the worker's shared UNet is left as it was found
    assert not parts["base"].unet.is_gradient_checkpointing
    assert parts["base"] is cached_base_model("tiny", "cpu")


def test_a_lora_trial_adds_its_adapters_over_the_workers_weights_and_leaves_them_as_they_were():
    """LoRA on the UNet and the text encoders: the trial's modules hold the worker's shared frozen
    weights themselves (no copy of them, the memory an SDXL UNet's copy took), its adapters are its
    own, and the base model keeps its modules, its weights' values and their frozen state; a trial
    that trains encoder weights (freeze full, attention_only beside a LoRA, top_layers) copies those
    weights alone and leaves the base's as they were. The samples, whose pipeline loads the
    learned embedding into its encoders, leave them too."""
    base = cached_base_model("tiny", "cpu")
    before = {id(m): {k: v.clone() for k, v in m.state_dict().items()} for m in base.modules()}
    layout = {id(m): sorted(n for n, _ in m.named_modules()) for m in base.modules()}
    run = train({**FAST, "lora_rank": 4, "lora_targets": "both", "steps": 3},
                samples={"seeds": [0], "steps": 2})  # the samples load the embedding into their encoders
    assert any(name.startswith("samples/") for name in run.result["artifacts"])
    parts = {"unet": run.unet, "text_encoders": run.text_encoders}
    unfrozen = {mode: trained_parts({"freeze": mode, "steps": 3, **extra})[1]["text_encoders"][0]
                for mode, extra in (("full", {}), ("attention_only", {"lora_rank": 4, "lora_targets": "text"}),
                                    ("top_layers", {"unfreeze_layers": 1}))}
    for m in base.modules():
        assert sorted(n for n, _ in m.named_modules()) == layout[id(m)]
        assert all(torch.equal(v, before[id(m)][k]) for k, v in m.state_dict().items())
        assert not any(p.requires_grad for p in m.parameters())
    for trial, shared in ((parts["unet"], base.unet), *zip(parts["text_encoders"], base.text_encoders)):
        assert trial is not shared and any("lora_" in n for n, _ in trial.named_parameters())
        ptrs = {p.data_ptr() for n, p in trial.named_parameters() if "lora_" not in n}
        assert ptrs == {p.data_ptr() for p in shared.parameters()}
    base_ptrs = {p.data_ptr() for p in base.text_encoders[0].parameters()}
    for mode, te in unfrozen.items():  # what trains is the trial's own; what does not, the base's
        trains = {n: p.requires_grad for n, p in te.named_parameters() if "lora_" not in n}
        assert any(trains.values()) and not all(trains.values()), mode
        for name, p in te.named_parameters():
            assert (p.data_ptr() in base_ptrs) == (not p.requires_grad), (mode, name)


def test_gradient_checkpointing_on_trained_encoders_too():
    plain, _ = trained_parts({"freeze": "full"})
    ckpt, _ = trained_parts({"freeze": "full", "gradient_checkpointing": True})
    assert ckpt["peak_mem_mb"] < plain["peak_mem_mb"]
    assert ckpt["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)


def test_ema_decay_exports_the_moving_average(monkeypatch):
    """Every optimizer step updates the average (diffusers' EMAModel: its decay ramps as
    (1+t)/(10+t) up to ema_decay), and the exported vector is the average of the vectors the
    optimizer produced, computed here by hand from each step's raw vector."""
    raw = []
    step = torch.optim.AdamW.step

    def recording(self, *a, **kw):
        out = step(self, *a, **kw)
        raw.append(self.param_groups[0]["params"][0].detach().clone())  # the concept code z
        return out

    start = train({**FAST, "steps": 1, "lr": 1e-12}).trainables.concepts[0].z.detach().clone()
    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    _, parts = trained_parts({"steps": 12, "ema_decay": 0.9})
    shadow = start.clone()
    for t, z in enumerate(raw, start=1):
        decay = 0.0 if t <= 1 else min((1 + (t - 1)) / (10 + (t - 1)), 0.9)
        shadow = shadow - (1 - decay) * (shadow - z)
    exported = parts["concept_embeddings"][0].z.detach()
    assert len(raw) == 12 and torch.allclose(exported, shadow, atol=1e-6)
    assert not torch.allclose(exported, raw[-1], atol=1e-4)  # the average, not the last step's


def test_weight_decay_per_group():
    from objectives._params import Knobs
    from objectives._trainables import optimizer_groups

    run = train({**FAST, "lora_rank": 2})
    groups = optimizer_groups(run.trainables, Knobs.resolve({"lora_rank": 2, "weight_decay": 0.1,
                                                              "embedding_weight_decay": 0.0}))
    assert [g["weight_decay"] for g in groups] == [0.0, 0.1]
    # on the concept vectors: a heavy decay shrinks them (diffusers #1009)
    _, light = trained_parts({"steps": 10, "embedding_weight_decay": 0.0, "init_std": 0.5})
    _, heavy = trained_parts({"steps": 10, "embedding_weight_decay": 50.0, "init_std": 0.5})
    assert float(heavy["concept_embeddings"][0].z.norm()) < float(light["concept_embeddings"][0].z.norm())



def test_the_memory_meter_keeps_nothing_alive_of_a_branch_the_loss_does_not_use():
    """On the CPU the meter counts the tensors saved for backward. A forward the loss does not use
    (SDXL's first encoder's last layer) is never backpropagated; an op in it that saves its own
    output (sigmoid, so quick_gelu) once kept its graph, the meter and so the model alive: 14 GB
    of `random:sdxl` stayed resident after its trial. Now the model goes when its trial does."""
    import gc
    import weakref

    from objectives._memory import MemoryMeter

    model = torch.nn.Linear(4, 4)
    meter = MemoryMeter(torch.device("cpu"), [model])
    x = torch.randn(2, 4, requires_grad=True)
    with meter.step():
        used = model(x).sum()
        unused = torch.sigmoid(model(x))
    used.backward()
    alive = weakref.ref(model)
    del model, meter, used, unused
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine", "cosine_with_restarts"])
def test_the_lr_follows_diffusers_schedule(schedule):
    """lr_scheduler (and lr_cycles) are diffusers' get_scheduler's, after warmup_steps of warmup."""
    from diffusers.optimization import get_scheduler

    knobs = {"steps": 8, "lr": 1e-2, "warmup_steps": 2, "lr_scheduler": schedule, "lr_cycles": 2, "val_every": 8}
    got = train(knobs).result["history"]["lr"]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-2 * 1.0)  # the embedding group's lr
    ref = get_scheduler(schedule, opt, num_warmup_steps=2, num_training_steps=8, num_cycles=2)
    want = []
    for _ in range(8):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert got == pytest.approx(want)
    assert len(set(round(v, 12) for v in got)) > (1 if schedule == "constant" else 3) or schedule == "constant"


def test_prodigy_adapts_its_step_and_d_coef_scales_it():
    """optimizer prodigy (prodigyopt): its d starts at d0 = 1e-6 and grows; d_coef scales the d it
    adapts to; the concept rows move at lr 1."""
    runs = {c: train({**FAST, "steps": 6, "lr": 1.0, "optimizer": "prodigy", "prodigy_d_coef": c, "val_every": 6})
            for c in (1.0, 4.0)}
    d1, d4 = (runs[c].result["history"]["prodigy_d"] for c in (1.0, 4.0))
    assert len(d1) == 6 and d1[-1] > 1e-6 and d4[-1] > 2 * d1[-1]
    assert all(b >= a for a, b in zip(d1, d1[1:]))  # d never shrinks
    assert runs[1.0].result["history"]["lr"] == [1.0] * 6  # lr multiplies d; the schedule is constant
    assert "prodigy_d" not in train({**FAST, "steps": 2, "val_every": 2}).result["history"]


def test_adafactor_and_adamw8bit_come_from_their_libraries(monkeypatch):
    """optimizer adafactor is transformers' Adafactor at the groups' fixed lr (not its relative
    step); adamw8bit is refused with a reason on a worker without CUDA."""
    import transformers.optimization as T

    made = []

    class Spy(T.Adafactor):
        def __init__(self, params, **kw):
            made.append(kw)
            super().__init__(params, **kw)

    monkeypatch.setattr(T, "Adafactor", Spy)
    run = train({**FAST, "steps": 3, "optimizer": "adafactor", "embedding_lr_ratio": 0.5, "val_every": 3})
    assert made == [{"scale_parameter": False, "relative_step": False, "warmup_init": False}]
    assert run.result["history"]["lr"] == [FAST["lr"] * 0.5] * 3
    with pytest.raises(ValueError, match="optimizer adamw8bit needs a CUDA device"):
        train({**FAST, "steps": 1, "optimizer": "adamw8bit"})
