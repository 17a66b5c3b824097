"""``explorl export``: a run's (or a checkpoint's) policy as a plain Hugging Face model directory,
LoRA adapters merged into their base (PEFT's ``merge_and_unload``), loadable with
``AutoModelForCausalLM.from_pretrained`` and servable by any engine."""

from __future__ import annotations

from pathlib import Path

from explorl.adapters import load_for_inference
from explorl.errors import ConfigError
from explorl.eval.run import resolve_model
from explorl.models import load_tokenizer, quiet_transformers, resolve_device


def export_model(model: str, out_dir: Path, *, overrides: list[str] | None = None,
                 force: bool = False) -> Path:
    """Write ``model`` (a run dir, a checkpoint, a model dir or ``lab:<task>``) merged into
    ``out_dir`` (``save_pretrained`` in safetensors, with the tokenizer); returns it. The
    weights keep their dtype (float32 masters; a bf16 base stays bf16)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise ConfigError(f"--out {out_dir}: exists and is not empty (--force overwrites)")
    weights, tok_dir, cfg, base = resolve_model(model, overrides)
    device = resolve_device("cpu" if cfg.model.device == "auto" else cfg.model.device)
    merged, _ = load_for_inference(weights, cfg.model, device, base)
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        merged.save_pretrained(out_dir, safe_serialization=True)
        load_tokenizer(tok_dir, cfg.model).save_pretrained(out_dir)
    return out_dir
