"""The shapes of csweep's models and where their files live, without torch: the published
SD 1.5 / SDXL configs that `random:sd15` / `random:sdxl` use, the tiny models' shipped folders,
the machine's cache."""

from __future__ import annotations

from pathlib import Path

from common.cache import cache_root  # noqa: F401 - the machine's cache, re-exported

TINY_MODELS = ("tiny", "tiny-sdxl")
SHIPPED = Path(__file__).parent / "tiny_models"


def shipped_dir(name: str) -> Path:
    return SHIPPED / name


# --- the published architectures with seeded random weights (csweep export-model random:...) ----
# The configs as diffusers publishes them for runwayml/stable-diffusion-v1-5 and
# stabilityai/stable-diffusion-xl-base-1.0 (unet/, vae/, text_encoder*/ config.json), so that a
# study can be dry-run on the real shapes (memory per config, step time, every knob's code path)
# without the weights, which csweep never downloads.
RANDOM_MODELS = ("random:sd15", "random:sdxl")
VOCAB = 49408  # CLIP's vocabulary: the embedding matrices at their real size

SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                 down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                 up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
SDXL_UNET = dict(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280), cross_attention_dim=2048, attention_head_dim=(5, 10, 20),
                 transformer_layers_per_block=(1, 2, 10), use_linear_projection=True,
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                 addition_embed_type="text_time", addition_time_embed_dim=256,
                 projection_class_embeddings_input_dim=2816)
VAE = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
           block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4)
CLIP_L = dict(vocab_size=VOCAB, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768)
CLIP_G = dict(vocab_size=VOCAB, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
              num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu", projection_dim=1280)
SCHEDULER = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                 steps_offset=1, clip_sample=False)
