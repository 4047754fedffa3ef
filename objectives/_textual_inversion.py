"""The textual_inversion objective: one real diffusers training run per trial, read as a
narrated loop (`train`), as diffusers' textual-inversion example reads: the parameters resolved
once (Knobs), the model set up, the trial's own parts built (objectives._trainables), its prompts
tokenized (._prompts), the optimizer, then per step a batch, its loss, the health checks and the
update (._step), validations on the way (._validation), and at the end the last validation, the
exports and the samples. The frozen base model is shared by every trial a worker runs.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ._data import ConceptSet
from ._fidelity import fidelity
from ._health import HealthMonitor
from ._health_config import HealthConfig, TrialStopped
from ._memory import MemoryMeter
from ._model import BaseModel
from ._params import Knobs, default_val_every
from ._prompts import Prompts, tokenize_prompts
from ._samples import SampleConfig, draw_samples
from ._step import Denoiser, autocast_for, batch_loss, draw_batch
from ._trainables import Trainables, TrialParts, build_parts, optimizer_groups, trial_exports
from ._validation import ValidationCurve, evaluated, validate
from ._worker_cache import (  # noqa: F401 - cached_base_model: what the tests and benchmarks clear
    DTYPES,
    _cached_data,
    _datasets,
    _fidelity_encoder,
    cached_base_model,
    pick_device,
)

StepCallback = Callable[[int, Mapping[str, float]], None]
# called after every validation during training with (step, {"val_loss", "peak_mem_mb"}); a
# non-empty answer is the reason to stop the trial there (csweep's --early-stop dominated)
Reporter = Callable[[int, Mapping[str, float]], "str | None"]
SCORES = ("final", "best")


@dataclass(frozen=True)
class TrialOutput:
    """What a trial gives back: its two objectives, every other figure (`metrics`: the per-timestep
    val_loss, the validation curve's, the samples', parameter counts, health figures), its
    per-step history, its validations, its tags and health report, and its files."""

    val_loss: float
    peak_mem_mb: float
    metrics: Mapping[str, float]
    history: Mapping[str, list[float]]
    curve: list[dict[str, float]]
    tags: Mapping[str, str]
    health: Mapping[str, Any]
    artifacts: Mapping[str, bytes]
    datasets: list[dict[str, Any]] = field(default_factory=list)

    def as_result(self) -> dict[str, Any]:
        """The objective's answer as a plug-in's is read (docs/objective.md): the figures at the
        top level beside history, tags, health, artifacts, curve and datasets."""
        return {"val_loss": self.val_loss, "peak_mem_mb": self.peak_mem_mb, **self.metrics,
                "history": self.history, "tags": self.tags, "health": self.health, "artifacts": self.artifacts,
                "curve": self.curve, "datasets": self.datasets}


@dataclass
class Trained:
    """A finished training run: the objective's output and the trained parts."""

    output: TrialOutput
    embeddings: dict[str, torch.Tensor]  # placeholder token -> its learned row (first encoder)
    base: BaseModel
    text_encoders: list[torch.nn.Module]
    unet: torch.nn.Module
    trainables: Trainables

    @property
    def result(self) -> dict[str, Any]:
        return self.output.as_result()


def textual_inversion(
    params: Mapping[str, Any],
    *,
    model: str = "tiny",
    data: str | None = None,
    health: HealthConfig | Mapping[str, Any] | None = None,
    samples: SampleConfig | Mapping[str, Any] | None = None,
    score: str = "final",
    report: Reporter | None = None,
) -> dict[str, Any]:
    """Train concept embeddings (and what the knobs unfreeze); returns val_loss, peak_mem_mb,
    metrics, per-step history, the validation curve, the learned weights as diffusers-loadable
    files and, when `samples` is given and enabled, a grid of sample images per concept.
    `score="best"`: val_loss, the exports and the samples are those of the best validated step."""
    return train(params, model=model, data=data, health=health, samples=samples, score=score,
                 report=report).result


@dataclass
class TrialRun:
    """One trial's set-up: its knobs, the shared base model and cached latents, its own parts
    and prompts, and the model as a denoiser."""

    knobs: Knobs
    device: torch.device
    base: BaseModel
    data: dict[str, Any]  # _cached_data: the concepts, their latents and combinations
    parts: TrialParts
    prompts: Prompts
    model: Denoiser

    @property
    def concepts(self) -> ConceptSet:
        return self.data["concepts"]

    def validate(self, *, final: bool) -> dict[str, float]:
        for ce in self.parts.trainables.concepts:
            ce.grad_scale = None
        return validate(self.model, self.data, self.prompts, len(self.concepts.names), self.base.scheduler,
                        final=final)


@dataclass
class Optimization:
    """AdamW over the trainables' groups, the warmup schedule, the moving average (ema_decay) and
    fp16's gradient scaler."""

    params: list[torch.Tensor]
    opt: torch.optim.Optimizer
    schedule: Any
    ema: Any = None
    scaler: Any = None


@dataclass
class Progress:
    """What the loop leaves: the per-step history, the validations, and why it stopped early."""

    curve: ValidationCurve
    history: dict[str, list[float]]
    optim: Optimization
    monitor: HealthMonitor
    meter: MemoryMeter
    val_init: float
    val_every: int
    stopped: TrialStopped | None = None


def train(
    params: Mapping[str, Any],
    *,
    model: str = "tiny",
    data: str | None = None,
    health: HealthConfig | Mapping[str, Any] | None = None,
    samples: SampleConfig | Mapping[str, Any] | None = None,
    on_step: StepCallback | None = None,
    score: str = "final",
    report: Reporter | None = None,
) -> Trained:
    """The textual-inversion run itself (`on_step(step, metrics)` after every step)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    knobs = Knobs.resolve(params)
    hcfg = health if isinstance(health, HealthConfig) else HealthConfig.from_mapping(health or {})
    scfg = (samples if isinstance(samples, SampleConfig) else
            SampleConfig(enabled=False) if samples is None else SampleConfig.from_mapping(samples))
    gen = torch.Generator(device="cpu").manual_seed(knobs.seed)  # init, batches and noise, in order
    started = time.perf_counter()
    run = set_up(knobs, model, data, gen)
    with run.parts.installed():
        progress = training_loop(run, hcfg, gen, score=score, on_step=on_step, report=report)
        summary = health_summary(run, progress)
        if progress.stopped is not None:
            stopped = progress.stopped
            raise TrialStopped(stopped.reason, stopped.step, rung=stopped.rung, partial=summary.partial(progress))
        final, val_final = last_validation(run, progress, score=score, report=report, peak=summary.peak)
        learned = [ce.rows().detach().float().cpu().clone() for ce in run.parts.trainables.concepts]
        artifacts = trial_exports(run.base, run.parts.tokens, run.concepts.names, learned,
                                  run.parts.unet if knobs.lora_unet else None,
                                  run.parts.encoders if knobs.lora_text else [], knobs)
        artifacts["health.json"] = summary.health_json
    sample_metrics = trial_samples(run, artifacts, scfg)
    counts = run.parts.trainables.counts()
    output = TrialOutput(
        val_loss=final["val_loss"], peak_mem_mb=summary.peak,
        metrics={
            **{k: v for k, v in final.items() if k != "val_loss"},
            "val_loss_init": progress.val_init,
            "val_loss_final": val_final,
            "steps_run": knobs.steps,
            "val_every": progress.val_every,
            **progress.curve.metrics(),
            "train_seconds": time.perf_counter() - started - sample_metrics.get("sample_seconds", 0.0),
            **sample_metrics,
            "trainable_params": sum(counts.values()),
            **{f"trainable_params_{k}": v for k, v in counts.items()},
            **summary.metrics,
        },
        history=progress.history, curve=progress.curve.points, tags=summary.tags, health=summary.report,
        artifacts=artifacts,
        datasets=_datasets(run.model.resolution, data,
                           tuple((k, getattr(knobs, k)) for k in ("crop", "flip", "learnable_property"))),
    )
    flat = run.parts.flat_tokens
    return Trained(output, {tok: learned[0][i] for i, tok in enumerate(flat)}, run.base, run.parts.encoders,
                   run.parts.unet, run.parts.trainables)


def set_up(knobs: Knobs, model: str, data: str | None, gen: torch.Generator) -> TrialRun:
    """The device, the worker's shared base model and cached latents, the trial's own parts
    (drawing its concept rows from `gen`) and its prompts."""
    device = pick_device()
    if knobs.precision == "fp16" and device.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device (GradScaler); this worker has none: use bf16 or fp32")
    base = cached_base_model(model, device.type, knobs.precision)
    resolution = knobs.resolution or base.resolution
    cache = _cached_data(model, device.type, knobs.precision, data, resolution, knobs.crop, knobs.flip > 0)
    parts = build_parts(base, knobs, cache["concepts"], gen, device)
    prompts = tokenize_prompts(parts, knobs, cache["concepts"], cache["combos"], cache["val_combo"], device)
    model_ = Denoiser(parts.encoders, parts.unet, resolution,
                      autocast_for(knobs.precision, device, DTYPES[knobs.precision]))
    return TrialRun(knobs, device, base, cache, parts, prompts, model_)


def optimization(run: TrialRun) -> Optimization:
    """The optimizer (make_optimizer) over the trainables' groups: the embedding's lr is lr x
    embedding_lr_ratio; the lr schedule, after warmup_steps of linear warmup (diffusers'
    get_scheduler); the trainables' moving average (diffusers' EMAModel) with ema_decay; a
    GradScaler for fp16."""
    from diffusers.optimization import get_scheduler

    knobs = run.knobs
    groups = optimizer_groups(run.parts.trainables, knobs)
    params = [p for g in groups for p in g["params"]]
    opt = make_optimizer(knobs, groups, run.device)
    ema = None
    if knobs.ema_decay > 0:
        from diffusers.training_utils import EMAModel

        ema = EMAModel(params, decay=knobs.ema_decay)
    schedule = get_scheduler(knobs.lr_scheduler, opt, num_warmup_steps=knobs.warmup_steps,
                             num_training_steps=knobs.steps, num_cycles=knobs.lr_cycles)
    scaler = torch.amp.GradScaler("cuda") if knobs.precision == "fp16" else None
    return Optimization(params, opt, schedule, ema, scaler)


def make_optimizer(knobs: Knobs, groups: list[dict[str, Any]], device: torch.device) -> torch.optim.Optimizer:
    """The `optimizer` knob, from the library that defines it, over the groups (each with its lr
    and weight decay): torch's AdamW, bitsandbytes' AdamW8bit (CUDA only), prodigyopt's Prodigy
    (with prodigy_d_coef), transformers' Adafactor at the groups' fixed lr."""
    if knobs.optimizer == "adamw8bit":
        if device.type != "cuda":
            raise ValueError("optimizer adamw8bit needs a CUDA device (bitsandbytes' 8-bit AdamW); this worker has "
                             "none: use adamw")
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ValueError("optimizer adamw8bit needs the bitsandbytes package on the worker "
                             "(pip install bitsandbytes)") from None
        return bnb.optim.AdamW8bit(groups)
    if knobs.optimizer == "prodigy":
        from prodigyopt import Prodigy

        return Prodigy(groups, d_coef=knobs.prodigy_d_coef)
    if knobs.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(groups, scale_parameter=False, relative_step=False, warmup_init=False)
    return torch.optim.AdamW(groups)


def health_monitor(run: TrialRun, hcfg: HealthConfig) -> HealthMonitor:
    """The health checks' view of the trainables, and the vocabulary's mean row norm that the
    concept rows' norms are judged against."""
    concepts = run.parts.trainables.concepts
    vocab_norm = float(torch.stack([
        ce.base.weight[: ce.first_id].detach().float().norm(dim=-1).mean() for ce in concepts
    ]).mean())
    return HealthMonitor(hcfg, run.parts.trainables.norm_groups(), run.parts.trainables.named(),
                         lambda: [ce.rows() for ce in concepts], vocab_norm)


def validation_steps(run: TrialRun, report: Reporter | None) -> tuple[int, set[int]]:
    """(every how many steps to validate, the extra steps to validate at). With `val_every` left
    to its default and early stops on, also validate at each rung, so that a rung judges the
    trial at its own step (at 1/9 of the steps, not at the next validation)."""
    knobs = run.knobs
    every = knobs.val_every or default_val_every(knobs.steps, int(run.data["val_lat"].shape[0]), knobs.batch_size)
    rungs = set(report.rung_steps()) if knobs.val_every is None and hasattr(report, "rung_steps") else set()
    return every, rungs


def training_loop(run: TrialRun, hcfg: HealthConfig, gen: torch.Generator, *, score: str,
                  on_step: StepCallback | None, report: Reporter | None) -> Progress:
    """Validate, then per step: a batch, its loss and gradients, the health checks, the update, and
    every `val_every` steps a validation that the early stop (`report`) may stop the trial at."""
    knobs, trainables = run.knobs, run.parts.trainables
    val_every, rung_at = validation_steps(run, report)
    val_started = time.perf_counter()
    first = run.validate(final=False)
    curve = ValidationCurve(trainables.named() if score == "best" else None)
    curve.add(0, first, time.perf_counter() - val_started)
    if report is not None:  # the curve's first point, as a plug-in yields it (no rung at step 0;
        report(0, {"val_loss": first["val_loss"]})  # its memory is known from the first step on)
    optim = optimization(run)
    monitor = health_monitor(run, hcfg)
    opt, scaler = optim.opt, optim.scaler
    meter = MemoryMeter(run.device, [*run.parts.encoders, run.parts.unet])
    history: dict[str, list[float]] = {"train_loss": [], "lr": []}
    if knobs.contrastive_weight > 0:
        history["contrastive"] = []
    progress = Progress(curve, history, optim, monitor, meter, first["val_loss"], val_every)
    for step in range(knobs.steps):
        batch = draw_batch(knobs, run.data, run.prompts, run.base.scheduler, gen, run.device)
        with meter.step(optim.params):
            loss, loss_main, term = batch_loss(run.model, trainables.concepts, knobs, batch)
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        value = float(loss_main.detach())
        history["train_loss"].append(value)
        try:  # with a GradScaler, non-finite gradients are skipped steps, not divergence
            monitor.after_backward(step, value, grads_may_overflow=scaler is not None)
        except TrialStopped as exc:
            progress.stopped = exc
            break
        lr_now = update(optim, knobs, monitor)
        history["lr"].append(lr_now)
        if "d" in opt.param_groups[0]:  # Prodigy's adapted step size: its effective lr is d x lr
            history.setdefault("prodigy_d", []).append(float(opt.param_groups[0]["d"]))
        if term is not None:
            history["contrastive"].append(float(term.detach()))
        if on_step is not None:
            on_step(step, {"train_loss": value, "lr": lr_now})
        try:  # norms and the loss phase, after the update
            monitor.after_step(step, history["train_loss"])
        except TrialStopped as exc:
            progress.stopped = exc
            break
        done = step + 1  # steps trained; the last one is validated with the final checks
        if (done % val_every == 0 or done in rung_at) and done < knobs.steps:
            val_started = time.perf_counter()
            with evaluated(optim.ema, optim.params):
                curve.add(done, run.validate(final=False), time.perf_counter() - val_started)
            reason = report(done, {"val_loss": curve.points[-1]["val_loss"],
                                   "peak_mem_mb": meter.peak_mb(optim.params, opt)}) if report else None
            if reason:
                progress.stopped = TrialStopped(reason, step, rung=getattr(report, "last_rung", 0))
                break
    for ce in trainables.concepts:
        ce.grad_scale = None
    return progress


def update(optim: Optimization, knobs: Knobs, monitor: HealthMonitor) -> float:
    """Clip (max_grad_norm), step (through fp16's scaler), advance the schedule, clear the
    gradients, update the moving average; returns the lr the step used."""
    opt, scaler = optim.opt, optim.scaler
    if knobs.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(optim.params, knobs.max_grad_norm)
    lr_now = opt.param_groups[0]["lr"]
    if scaler:
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        monitor.record_scaler(before, skipped=scaler.get_scale() < before)
    else:
        opt.step()
    optim.schedule.step()
    opt.zero_grad(set_to_none=True)
    if optim.ema is not None:
        optim.ema.step(optim.params)
    return lr_now


@dataclass
class HealthSummary:
    report: dict[str, Any]
    tags: dict[str, str]
    metrics: dict[str, float]
    peak: float
    health_json: bytes

    def partial(self, progress: Progress) -> dict[str, Any]:
        """What a stopped trial still tells (TrialStopped.partial)."""
        stopped = progress.stopped
        return {"history": progress.history, "tags": self.tags, "peak_mem_mb": self.peak, "health": self.report,
                "metrics": {"val_loss_init": progress.val_init, "steps_run": stopped.step + 1, **self.metrics,
                            **progress.curve.metrics(), "peak_mem_mb": self.peak},
                "artifacts": {"health.json": self.health_json}, "curve": progress.curve.points}


def health_summary(run: TrialRun, progress: Progress) -> HealthSummary:
    """The health report (its verdict and phase as tags), the peak memory and the embedding's
    health figures, once the loop is over."""
    stopped = progress.stopped
    report = progress.monitor.finish(progress.history["train_loss"], stopped=stopped.reason if stopped else None)
    progress.history |= progress.monitor.history
    peak = progress.meter.peak_mb(progress.optim.params, progress.optim.opt)
    tags = {"peak_mem_source": progress.meter.source, "device": run.device.type, "model": run.base.source,
            "health": report["health"], "loss_phase": report["phase"]}
    metrics = {k: report[k] for k in ("embed_norm", "embed_norm_max_ratio", "embed_norm_growth",
                                      "embed_vector_std_min", "cos_sim_mean", "cos_sim_spread")
               if report[k] is not None and math.isfinite(report[k])}
    return HealthSummary(report, tags, metrics, peak, json.dumps(report, indent=2, default=float).encode())


def last_validation(run: TrialRun, progress: Progress, *, score: str, report: Reporter | None,
                    peak: float) -> tuple[dict[str, float], float]:
    """(the scored validation, the last step's val_loss). From here on the trainables are their
    moving average (when there is one); with score best, the best step's, restored."""
    optim, curve, steps = progress.optim, progress.curve, run.knobs.steps
    if optim.ema is not None:
        optim.ema.copy_to(optim.params)
    val_started = time.perf_counter()
    final = run.validate(final=True)
    curve.add(steps, final, time.perf_counter() - val_started)
    if report is not None:  # the last point, for the rungs of trials with more steps
        report(steps, {"val_loss": final["val_loss"], "peak_mem_mb": peak})
    val_final = final["val_loss"]
    if score == "best" and curve.best_step != steps:
        curve.restore()  # the best step's trainables, for the score, exports and samples
        final = run.validate(final=True)
    return final, val_final


def trial_samples(run: TrialRun, artifacts: dict[str, bytes], scfg: SampleConfig) -> dict[str, float]:
    """A grid of sample images per concept (diffusers' pipeline on the trial's own parts) into
    `artifacts`, and their concept fidelity against the training images."""
    if not scfg.enabled:
        return {}
    concepts, device = run.concepts, run.device
    drawn_at = time.perf_counter()
    drawn = draw_samples(run.base, run.parts.encoders, run.parts.unet, artifacts, concepts.names, scfg, device,
                         autocast=run.model.autocast)
    for name in concepts.names:
        artifacts[f"samples/{name}.png"] = drawn.grid_png(name)
    real = {name: [(im.transpose(1, 2, 0) + 1) / 2 for im, c in concepts.train if c == (ci,)]
            for ci, name in enumerate(concepts.names)}
    out = fidelity(_fidelity_encoder(scfg.fidelity_model, run.base, device.type), drawn.images, real)
    out["sample_seconds"] = time.perf_counter() - drawn_at
    return out

