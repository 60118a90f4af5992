"""Segment Anything image encoders exported to ONNX: a small test model and the full-size recipe.

The encoder is Meta's own `segment_anything.modeling.image_encoder.ImageEncoderViT` (package
segment-anything 1.0), so the exported graph has exactly what real SAM exports have: a patch
Conv, windowed attention with padding (window_partition / window_unpartition), global attention
blocks, decomposed relative positions (two Einsum per block: ``bhwc,hkc->bhwk`` and
``bhwc,wkc->bhwk``), the Transpose/Reshape chains around attention and, from the TorchScript
exporter, the Shape/Gather/Concat arithmetic that DirectML keeps on the CPU.

1. `export_small`: a reduced encoder (64x64 image, patch 8 -> an 8x8 token grid, 3 blocks,
   embed 48, 3 heads, neck 32, window 5 so the grid is padded 8 -> 10 like SAM pads 64 -> 70
   with window 14; blocks 0-1 windowed, block 2 global), legacy TorchScript exporter, opset 17,
   seeded weights.  The sizes are pairwise distinct (3 heads, 4 windows of 25 tokens, 64
   tokens, head dim 16) so a rewrite that mixes up two axes changes the numbers.
2. `export_dynamo`: the same encoder through torch's dynamo exporter (opset 18: the exporter
   cannot convert its Pad down to opset 17), dynamic batch.
3. `export_full`: the real ViT-B/L/H encoder (1024x1024, patch 16, window 14, neck 256) with the
   `image_encoder.*` weights of a user's checkpoint; over 2 GB (ViT-H) the weights go to one
   external data file.

    python -m models.sam_encoder --checkpoint sam_vit_b_01ec64.pth --variant vit_b -o sam_vit_b.onnx
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.util
import io
import json
import os
import pathlib
import sys
import tempfile
import types
import warnings
from collections.abc import Mapping

import numpy as np
import onnx

import dmlopt.io.model

INPUT_NAME = "image"
OUTPUT_NAME = "image_embeddings"
OPSET = 17
DYNAMO_OPSET = 18


def image_encoder_module():
    """Import `segment_anything.modeling.image_encoder` without running the package __init__.

    Why: `segment_anything/__init__.py` imports the predictor, whose transforms import
    torchvision, which dmlopt does not depend on.  When torchvision is missing, a bare package
    object with the real `__path__` stands in for `segment_anything`, so its submodules import
    normally and nothing else is run.
    """
    if "segment_anything" not in sys.modules:
        spec = importlib.util.find_spec("segment_anything")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("segment-anything is not installed: pip install segment-anything==1.0")
        if importlib.util.find_spec("torchvision") is not None:
            importlib.import_module("segment_anything")
        else:
            package = types.ModuleType("segment_anything")
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules["segment_anything"] = package
    return importlib.import_module("segment_anything.modeling.image_encoder")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """ImageEncoderViT hyperparameters (the ones `segment_anything.build_sam` sets)."""

    embed_dim: int
    depth: int
    num_heads: int
    global_attn_indexes: tuple[int, ...]
    img_size: int = 1024
    patch_size: int = 16
    window_size: int = 14
    out_chans: int = 256
    mlp_ratio: float = 4.0

    def build(self):
        """A fresh ImageEncoderViT in eval mode (rel-pos on, LayerNorm eps 1e-6 as in SAM)."""
        import torch

        encoder_cls = image_encoder_module().ImageEncoderViT
        return encoder_cls(
            img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim,
            depth=self.depth, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio,
            out_chans=self.out_chans, qkv_bias=True,
            norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
            use_rel_pos=True, window_size=self.window_size,
            global_attn_indexes=tuple(self.global_attn_indexes)).eval()


VARIANTS = {
    "vit_b": EncoderConfig(embed_dim=768, depth=12, num_heads=12, global_attn_indexes=(2, 5, 8, 11)),
    "vit_l": EncoderConfig(embed_dim=1024, depth=24, num_heads=16, global_attn_indexes=(5, 11, 17, 23)),
    "vit_h": EncoderConfig(embed_dim=1280, depth=32, num_heads=16, global_attn_indexes=(7, 15, 23, 31)),
}

# Blocks 0, 1 windowed and 2 global: the first period of ViT-B's pattern (2, 5, 8, 11).
SMALL = EncoderConfig(embed_dim=48, depth=3, num_heads=3, global_attn_indexes=(2,),
                      img_size=64, patch_size=8, window_size=5, out_chans=32)


# ** the small test encoder **

def build_small(*, seed: int = 0, config: EncoderConfig = SMALL):
    """The small encoder with seeded weights (numpy RNG, so independent of torch's init)."""
    module = config.build()
    seeded_init(module, seed)
    return module


def seeded_init(module, seed: int) -> None:
    """Overwrite every parameter from a seeded numpy RNG.

    SAM zero-initialises rel_pos_h/w and pos_embed and sets LayerNorm to identity; left so,
    the rel-pos Einsums would add exact zeros and a wrong rewrite of them would still pass the
    numerics checks.  Here every parameter is non-trivial and O(1)-preserving.
    """
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            shape = tuple(param.shape)
            if "rel_pos" in name:
                value = rng.standard_normal(shape) * 0.3
            elif name == "pos_embed":
                value = rng.standard_normal(shape) * 0.1
            elif len(shape) == 1 and name.endswith("weight"):  # LayerNorm scale
                value = 1.0 + rng.standard_normal(shape) * 0.1
            elif len(shape) == 1:  # biases, LayerNorm shift
                value = rng.standard_normal(shape) * 0.05
            else:
                fan_in = int(np.prod(shape[1:]))
                value = rng.standard_normal(shape) / np.sqrt(fan_in)
            param.copy_(torch.from_numpy(value.astype(np.float32)))


def export_small(path, *, dynamic_batch: bool = False, img_size: int = SMALL.img_size,
                 patch_size: int = SMALL.patch_size, embed_dim: int = SMALL.embed_dim,
                 depth: int = SMALL.depth, num_heads: int = SMALL.num_heads,
                 window_size: int = SMALL.window_size,
                 global_attn_indexes: tuple[int, ...] = SMALL.global_attn_indexes,
                 out_chans: int = SMALL.out_chans, seed: int = 0) -> pathlib.Path:
    """Export the small encoder with the legacy TorchScript exporter (opset 17); returns the path."""
    config = EncoderConfig(embed_dim=embed_dim, depth=depth, num_heads=num_heads,
                           global_attn_indexes=tuple(global_attn_indexes), img_size=img_size,
                           patch_size=patch_size, window_size=window_size, out_chans=out_chans)
    module = build_small(seed=seed, config=config)
    buffer = io.BytesIO()
    _export_torchscript(module, buffer, img_size=img_size, opset=OPSET, dynamic_batch=dynamic_batch)
    proto = onnx.load_from_string(buffer.getvalue())
    _set_metadata(proto, "models.sam_encoder.export_small",
                  dict(dataclasses.asdict(config), dynamic_batch=dynamic_batch, seed=seed))
    dest = pathlib.Path(path)
    onnx.save(proto, dest)
    return dest


def export_dynamo(path, *, dynamic_batch: bool = True, seed: int = 0,
                  config: EncoderConfig = SMALL) -> pathlib.Path:
    """Export the small encoder through torch's dynamo exporter (`dynamo=True`), opset 18.

    The dynamo exporter writes opset 18 and fails to down-convert Pad to 17, so 18 it is.
    """
    import torch

    module = build_small(seed=seed, config=config)
    example = torch.zeros(1, 3, config.img_size, config.img_size)
    dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=1, max=1024)}} if dynamic_batch else None
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (example,), dynamo=True, opset_version=DYNAMO_OPSET,
                                    input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                    dynamic_shapes=dynamic_shapes, optimize=True, verbose=False)
    proto = program.model_proto
    _set_metadata(proto, "models.sam_encoder.export_dynamo",
                  dict(dataclasses.asdict(config), dynamic_batch=dynamic_batch, seed=seed))
    dest = pathlib.Path(path)
    onnx.save(proto, dest)
    return dest


# ** the full-size recipe **

class CheckpointError(ValueError):
    """The checkpoint cannot be read or does not hold the weights of the asked-for encoder."""


def export_full(checkpoint, variant, path, *, opset: int = OPSET, dynamic_batch: bool = False,
                external_data: bool | None = None) -> pathlib.Path:
    """Export the full-size SAM image encoder with a checkpoint's `image_encoder.*` weights.

    `checkpoint`: a path to a SAM .pth (e.g. sam_vit_b_01ec64.pth), or a state dict.
    `variant`: "vit_b", "vit_l", "vit_h" or an `EncoderConfig`.
    `external_data`: None writes the weights to `<name>.data` only when they are too large for
    one protobuf (ViT-H); True/False force it.  Returns the path written.
    """
    config = _variant_config(variant)
    state = load_encoder_state_dict(checkpoint)
    _check_matches(state, config, variant)
    module = config.build()
    module.load_state_dict(state, strict=True)
    dest = pathlib.Path(path)
    if not dest.parent.is_dir():
        raise dmlopt.OutputError(f"{dest}: folder {dest.parent} does not exist")
    with tempfile.TemporaryDirectory(prefix=".sam_export.", dir=dest.parent) as tmp:
        exported = pathlib.Path(tmp) / "encoder.onnx"
        # Over 2 GB the TorchScript exporter writes one file per weight next to `exported`;
        # dmlopt.save gathers them into a single `<name>.data` beside the destination.
        _export_torchscript(module, str(exported), img_size=config.img_size, opset=opset,
                            dynamic_batch=dynamic_batch)
        model = dmlopt.io.model.load(exported)
        name = variant if isinstance(variant, str) else "custom"
        source = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else "<state dict>"
        model.metadata_props.update(_metadata("models.sam_encoder.export_full", dict(
            variant=name, config=dataclasses.asdict(config), opset=opset, dynamic_batch=dynamic_batch,
            checkpoint=pathlib.Path(source).name if source != "<state dict>" else source)))
        dmlopt.io.model.save(model, dest, external_data=external_data)
    return dest


def load_encoder_state_dict(checkpoint) -> dict:
    """The `image_encoder.*` tensors of a SAM checkpoint, prefix removed.

    Accepts the official full-SAM checkpoints, encoder-only state dicts (keys such as
    `patch_embed.proj.weight`), and either wrapped in {"model": ...} or {"state_dict": ...}.
    """
    import torch

    if isinstance(checkpoint, Mapping):
        state = checkpoint
    else:
        file = pathlib.Path(checkpoint)
        if not file.is_file():
            raise CheckpointError(f"{file}: no such checkpoint file")
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - pickle/zip errors come in many types
            raise CheckpointError(f"{file}: not a readable torch checkpoint ({_load_failure(e)})") from e
    for wrapper in ("model", "state_dict"):
        if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
            state = state[wrapper]
    if not isinstance(state, Mapping):
        raise CheckpointError(f"checkpoint holds a {type(state).__name__}, not a state dict")
    prefix = "image_encoder."
    encoder = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not encoder and "patch_embed.proj.weight" in state:
        encoder = dict(state)
    if not encoder:
        sample = ", ".join(list(state)[:3]) or "none"
        raise CheckpointError(f"checkpoint has no image_encoder.* weights (first keys: {sample})")
    return encoder


def _load_failure(e: BaseException) -> str:
    """torch.load's reason in a few words (its weights-only message is a paragraph)."""
    text = str(e)
    if "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0][:120]
        return (f"{reason}; loaded with weights_only=True, so it must be a plain state dict of tensors. "
                "If you trust the file, torch.load it yourself and pass the dict to export_full")
    return (text.strip().splitlines() or [type(e).__name__])[0][:200]


def guess_variant(state: Mapping) -> str | None:
    """The official variant whose embed dim and depth match an encoder state dict, if any."""
    embed = state.get("patch_embed.proj.weight")
    if embed is None:
        return None
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    for name, config in VARIANTS.items():
        if config.embed_dim == embed.shape[0] and config.depth == depth:
            return name
    return None


def _variant_config(variant) -> EncoderConfig:
    if isinstance(variant, EncoderConfig):
        return variant
    if variant not in VARIANTS:
        raise ValueError(f"unknown SAM variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return VARIANTS[variant]


def _check_matches(state: Mapping, config: EncoderConfig, variant) -> None:
    """Fail with one readable line when the checkpoint is not of this variant.

    The expected shapes come from a module built on the meta device: no memory, no init time.
    """
    import torch

    with torch.device("meta"):
        expected = config.build().state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if not (missing or unexpected or wrong):
        return
    name = variant if isinstance(variant, str) else "the given config"
    parts = []
    if wrong:
        k = wrong[0]
        parts.append(f"{len(wrong)} shape mismatches (e.g. {k}: checkpoint {tuple(state[k].shape)}, "
                     f"{name} {tuple(expected[k].shape)})")
    if missing:
        parts.append(f"{len(missing)} missing weights (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected weights (e.g. {unexpected[0]})")
    guess = guess_variant(state)
    hint = f"; it looks like a {guess} checkpoint" if guess and guess != variant else ""
    raise CheckpointError(f"checkpoint does not match {name}: {', '.join(parts)}{hint}")


# ** shared export plumbing **

def _export_torchscript(module, f, *, img_size: int, opset: int, dynamic_batch: bool) -> None:
    """torch.onnx.export with the legacy TorchScript exporter (what most SAM exports use)."""
    import torch

    example = torch.zeros(1, 3, img_size, img_size)
    axes = {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings(), torch.no_grad():
        # TracerWarnings about Python bools in window_partition/get_rel_pos are expected:
        # those sizes are fixed by the image size.
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), f, dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes=axes, do_constant_folding=True)


def _metadata(builder: str, args: dict) -> dict[str, str]:
    import torch

    return {"builder": builder, "args": json.dumps(args, sort_keys=True),
            "source": "segment_anything 1.0 ImageEncoderViT", "torch": torch.__version__}


def _set_metadata(proto: onnx.ModelProto, builder: str, args: dict) -> None:
    onnx.helper.set_model_props(proto, _metadata(builder, args))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.sam_encoder",
        description="Export a full-size SAM image encoder (ViT-B/L/H) from a checkpoint to ONNX.")
    parser.add_argument("--checkpoint", required=True, help="SAM checkpoint (.pth), e.g. sam_vit_b_01ec64.pth")
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS), help="encoder size of the checkpoint")
    parser.add_argument("-o", "--output", required=True, help="ONNX file to write")
    parser.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    parser.add_argument("--dynamic-batch", action="store_true", help="make the batch axis symbolic")
    parser.add_argument("--external-data", action="store_true",
                        help="always write weights to <output>.data (automatic above 1.5 GB)")
    args = parser.parse_args(argv)
    if not pathlib.Path(args.checkpoint).is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    try:
        dest = export_full(args.checkpoint, args.variant, args.output, opset=args.opset,
                           dynamic_batch=args.dynamic_batch, external_data=args.external_data or None)
    except (CheckpointError, dmlopt.DmlOptError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    extra = "".join(f" + {f.name} ({f.stat().st_size / 1e6:.1f} MB)"
                    for f in dmlopt.io.model.external_data_files(dest))
    print(f"wrote {dest} ({dest.stat().st_size / 1e6:.1f} MB){extra}: SAM {args.variant} image encoder, "
          f"input {INPUT_NAME} [{'batch' if args.dynamic_batch else 1},3,1024,1024], opset {args.opset}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
