"""ModelConfig: the few numbers our Llama-family decoder needs, read from a HF config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")  # SmolLM2 ships as "llama"
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is outside what qoq's decoder implements."""


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # Llama-3 frequency scaling parameters (LLAMA3_ROPE_KEYS), or None
    max_position_embeddings: int
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2; Llama when attention_bias=True)
    tie_word_embeddings: bool
    model_type: str
    o_proj_bias: bool = False  # Llama's attention_bias also gives o_proj a bias; Qwen2's q/k/v bias does not
    hf: dict = field(default_factory=dict, repr=False)  # the raw HF config, kept for export

    @classmethod
    def from_hf(cls, cfg: Any) -> ModelConfig:
        """Accepts a transformers PretrainedConfig or a config.json dict."""
        raw = dict(cfg) if isinstance(cfg, dict) else cfg.to_dict()
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported (qoq supports: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        hf_cfg = cfg if not isinstance(cfg, dict) else _hf_config_from_dict(raw)
        _refuse_sliding_window(hf_cfg, model_type)
        rope_theta, rope_scaling = _rope(hf_cfg)
        if getattr(hf_cfg, "mlp_bias", False):
            raise UnsupportedModelError("mlp_bias=True is not supported (gate/up/down projections without bias)")
        num_heads = hf_cfg.num_attention_heads
        attention_bias = model_type == "qwen2" or bool(getattr(hf_cfg, "attention_bias", False))
        return cls(
            vocab_size=hf_cfg.vocab_size,
            hidden_size=hf_cfg.hidden_size,
            intermediate_size=hf_cfg.intermediate_size,
            num_layers=hf_cfg.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // num_heads,
            rms_norm_eps=hf_cfg.rms_norm_eps,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf_cfg.max_position_embeddings,
            attention_bias=attention_bias,
            o_proj_bias=model_type != "qwen2" and attention_bias,
            tie_word_embeddings=bool(hf_cfg.tie_word_embeddings),
            model_type=model_type,
            hf=raw,
        )


def _hf_config_from_dict(raw: dict):
    # transformers fills each model type's defaults and turns legacy rope_theta/rope_scaling into rope_parameters
    from transformers import AutoConfig

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return AutoConfig.for_model(raw["model_type"], **fields)


def _rope(hf_cfg) -> tuple[float, dict | None]:
    params = dict(getattr(hf_cfg, "rope_parameters", None) or {})
    theta = float(params.get("rope_theta", getattr(hf_cfg, "rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1 is not supported (RoPE rotates the whole head)")
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_ROPE_KEYS if k not in params]
        if missing:
            raise UnsupportedModelError(f"llama3 rope parameters lack {', '.join(missing)}")
        return theta, {k: params[k] for k in LLAMA3_ROPE_KEYS}
    raise UnsupportedModelError(f"rope_type {rope_type!r} is not supported (qoq supports: default, llama3)")


def _refuse_sliding_window(hf_cfg, model_type: str) -> None:
    window = getattr(hf_cfg, "sliding_window", None)
    if window is None or window >= hf_cfg.max_position_embeddings:
        return  # the window never binds: plain causal attention is exact
    layer_types = getattr(hf_cfg, "layer_types", None) or []
    if model_type == "mistral" or "sliding_attention" in layer_types:
        raise UnsupportedModelError(
            f"sliding-window attention (sliding_window={window} < max_position_embeddings="
            f"{hf_cfg.max_position_embeddings}) is not supported"
        )
