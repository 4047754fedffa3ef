"""Training throughput and memory: csweep's textual_inversion objective against a reference loop
written as diffusers' examples/textual_inversion does it (VAE encode every step, AdamW over the
whole embedding matrix, other rows restored after each step), on the same model, data, batch.

3. steps/s, tiny model on CPU (target csweep >= 1.5x) and an SD-1.5-sized model built from config
   (random weights, 256 px so a CPU finishes), so that the figure means something at real scale.
5. peak_mem_mb of both, by the same accounting (CPU: params + grads + optimizer state + peak bytes
   saved for backward; CUDA: the allocator's peak).

Run from the repository root: python benchmarks/throughput.py [--steps 30] [--sd15]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())

from objectives._data import TEMPLATES, synthetic_concepts  # noqa: E402
from objectives._memory import MemoryMeter  # noqa: E402
from objectives._model import BaseModel, build_tiny  # noqa: E402
from objectives import pick_device, textual_inversion  # noqa: E402


def reference_loop(base: BaseModel, *, steps: int, batch: int, resolution: int, lr: float = 5e-3,
                   passes_only: bool = False) -> tuple[float, float]:
    """diffusers' textual_inversion example, reduced to its training step. With passes_only, the
    model's own forward and backward passes alone (latents and token ids made once, no optimizer
    step, no row restore): a bound on the step time of any loop that keeps those passes."""
    device = pick_device()
    concepts = synthetic_concepts(resolution)
    tok = copy.deepcopy(base.tokenizer)
    placeholders = list(concepts.placeholders)
    tok.add_tokens(placeholders)
    te = copy.deepcopy(base.text_encoder)
    te.resize_token_embeddings(len(tok), mean_resizing=False)
    ids_new = tok.convert_tokens_to_ids(placeholders)
    emb = te.get_input_embeddings()
    with torch.no_grad():
        for i in ids_new:
            emb.weight[i] = emb.weight[tok("a", add_special_tokens=False).input_ids[0]]
    te.requires_grad_(False)
    emb.weight.requires_grad_(True)
    opt = torch.optim.AdamW(emb.parameters(), lr=lr, weight_decay=1e-2)
    orig = emb.weight.detach().clone()
    keep = torch.ones(len(tok), dtype=torch.bool)
    keep[ids_new] = False
    images = torch.stack([torch.from_numpy(im) for im, _ in concepts.train]).to(device)
    combos = [c for _, c in concepts.train]
    gen = torch.Generator().manual_seed(0)
    meter = MemoryMeter(device, [te, base.unet])
    t_first = None
    for step in range(steps):
        if step == 1:
            t_first = time.perf_counter()
        idx = torch.randint(0, len(images), (batch,), generator=gen)
        if not passes_only or step == 0:
            prompts = [TEMPLATES[step % len(TEMPLATES)].format(" and ".join(placeholders[c] for c in combos[i]))
                       for i in idx.tolist()]
            ids = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                      return_tensors="pt").input_ids.to(device)
        with meter.step([emb.weight]):
            if not passes_only or step == 0:
                with torch.no_grad():
                    latents = (base.vae.encode(images[idx.to(device)]).latent_dist.sample(gen)
                               * base.vae.config.scaling_factor)
            noise = torch.randn(latents.shape, generator=gen).to(device)
            t = torch.randint(0, 1000, (batch,), generator=gen).to(device)
            noisy = base.scheduler.add_noise(latents, noise, t)
            pred = base.unet(noisy, t, encoder_hidden_states=te(ids)[0]).sample
            loss = F.mse_loss(pred.float(), noise.float())
            loss.backward()
        if passes_only:
            emb.weight.grad = None
            continue
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            emb.weight[keep] = orig[keep]
    rate = (steps - 1) / (time.perf_counter() - t_first)
    return rate, meter.peak_mb([emb.weight], opt)


def csweep_rate(model: str, *, steps: int, batch: int, resolution: int) -> tuple[float, float]:
    stamps: list[float] = []
    out = textual_inversion({"steps": steps, "batch_size": batch, "resolution": resolution,
                             "init_from": "word:a"}, model=model,
                            on_step=lambda s, m: stamps.append(time.perf_counter()),
                            health={"early_stop": False})
    return (steps - 1) / (stamps[-1] - stamps[0]), out["peak_mem_mb"]


def sd15_sized(cache: dict) -> BaseModel:
    """SD-1.5 shapes (UNet, CLIP-L text encoder with its 49408-token vocabulary, VAE), random weights."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tiny = build_tiny()
    tok = copy.deepcopy(tiny.tokenizer)
    torch.manual_seed(0)
    te = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                      num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    # the tokenizer's ids must reach the end of the matrix: pad it with unused tokens
    tok.add_tokens([f"<unused-{i}>" for i in range(49408 - len(tok))])
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768)  # SD 1.5's defaults
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=2)
    for m in (te, unet, vae):
        m.requires_grad_(False).eval()
    base = BaseModel([tok], [te], unet, vae, DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085,
                                                            beta_end=0.012), source="sd15-sized", resolution=512)
    return base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--sd15", action="store_true", help="also the SD-1.5-sized model (slow on CPU)")
    ap.add_argument("--sd15-steps", type=int, default=4)
    ap.add_argument("--sd15-resolution", type=int, default=None,
                    help="pixels for the SD-1.5-sized model [512 on CUDA, 256 on CPU so that it finishes]")
    args = ap.parse_args()
    device = pick_device()
    print(f"# throughput benchmark  {time.strftime('%Y-%m-%d')}  {platform.platform()}  {os.cpu_count()} CPUs  "
          f"torch {torch.__version__}  device {device}  threads {torch.get_num_threads()}")
    base = build_tiny()
    csweep_rate("tiny", steps=3, batch=args.batch, resolution=32)  # warm caches
    rows = []
    for _ in range(3):  # interleaved, three times: the machine is noisy
        ours, ours_mem = csweep_rate("tiny", steps=args.steps, batch=args.batch, resolution=32)
        ref, ref_mem = reference_loop(base, steps=args.steps, batch=args.batch, resolution=32)
        bound, _ = reference_loop(base, steps=args.steps, batch=args.batch, resolution=32, passes_only=True)
        rows.append((ours, ref, bound, ours_mem, ref_mem))
    ours, ref, bound = (max(r[i] for r in rows) for i in range(3))
    ours_mem, ref_mem = rows[-1][3:]
    print(f"tiny, batch {args.batch}: csweep {ours:.1f} steps/s, reference {ref:.1f} steps/s, "
          f"speed-up {ours / ref:.2f}x; peak_mem_mb csweep {ours_mem:.1f}, reference {ref_mem:.1f}, "
          f"ratio {ref_mem / ours_mem:.2f}x")
    print(f"  the model's own passes alone: {bound:.1f} steps/s; the reference spends {1 - ref / bound:.0%} of "
          f"its step beyond them, so no loop that keeps them beats it by more than {bound / ref:.2f}x; "
          f"csweep runs at {ours / bound:.0%} of that bound")
    if args.sd15:
        import objectives._textual_inversion as ti

        big = sd15_sized({})
        ti.cached_base_model.cache_clear()
        ti._cached_data.cache_clear()
        real = ti.load_base_model
        ti.load_base_model = lambda spec: big if spec == "sd15-sized" else real(spec)
        res = args.sd15_resolution or (512 if device.type == "cuda" else 256)
        ours, ours_mem = csweep_rate("sd15-sized", steps=args.sd15_steps, batch=1, resolution=res)
        ref, ref_mem = reference_loop(big, steps=args.sd15_steps, batch=1, resolution=res)
        bound, _ = reference_loop(big, steps=args.sd15_steps, batch=1, resolution=res, passes_only=True)
        print(f"SD-1.5-sized, {res} px, batch 1: csweep {ours:.3f} steps/s, reference {ref:.3f} steps/s, "
              f"speed-up {ours / ref:.2f}x; peak_mem_mb csweep {ours_mem:.0f}, reference {ref_mem:.0f}, "
              f"ratio {ref_mem / ours_mem:.2f}x")
        print(f"  the model's own passes alone: {bound:.3f} steps/s (bound {bound / ref:.2f}x); csweep runs at "
              f"{ours / bound:.0%} of it")


if __name__ == "__main__":
    main()
