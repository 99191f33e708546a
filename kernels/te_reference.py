"""Transformer Engine's NVFP4 reference quantiser, run next to Nibble's (docs/design.md §2.2–2.3 are normative
as TE 2.20.2's ``NVFP4QuantizerRef``).

TE's reference (``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``) is pure PyTorch, but its
package imports TE's compiled core, which a CPU machine (or a TE wheel without its ``-cu12`` core) lacks.
So the two pure files are read from an installed TE or from a ``transformer_engine`` wheel and executed
with small stand-ins for the three modules they import and never use when quantising (the quantiser and
storage base classes, the GEMM parameter types). Nothing of TE's is copied here: its own code computes
every value compared.

TE returns codes, block scales and amax but not its global decode scale nor its 4/6 choice; both are
read from TE's own arithmetic as it runs (the first ``torch.div(1.0, S)`` it evaluates is ``g = 1/S``; with
4/6 its two E4M3 casts are the map-to-4 and map-to-6 candidates, in that order).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from .codecs import unpack_e2m1
from .tensors import NVFP4_BLOCK

TE_VERSION = "2.20.2"
_PACKAGE = "transformer_engine/pytorch/custom_recipes"
_FILES = ("reference_utils", "reference_nvfp4")
_STUBBED = (
    "transformer_engine",
    "transformer_engine.pytorch",
    "transformer_engine.pytorch.custom_recipes",
    "transformer_engine.pytorch.custom_recipes.gemm",
    "transformer_engine.pytorch.custom_recipes.reference_utils",
    "transformer_engine.pytorch.quantized_tensor",
)
_REFERENCE_MODULE = "transformer_engine.pytorch.custom_recipes.reference_nvfp4"


@dataclass(frozen=True)
class TEQuantized:
    """TE's quantisation of a 2-D tensor ``[M, K]``, in Nibble's layout.

    Attributes:
        codes: uint8 ``[M, K]``, one unpacked E2M1 code per element.
        block_scales: uint8 ``[M, K // 16]``, the E4M3 bytes.
        global_scale: float32 decode scale ``g = 1 / S``: ``[]`` per tensor, ``[M]`` per row.
        map_to_4: bool ``[M, K // 16]``, blocks whose stored scale is TE's map-to-4 candidate (and differs
            from its map-to-6 one); all False without four-over-six.
    """

    codes: torch.Tensor
    block_scales: torch.Tensor
    global_scale: torch.Tensor
    map_to_4: torch.Tensor


class TEReference:
    """TE's ``NVFP4QuantizerRef`` loaded from an installed Transformer Engine or a wheel file.

    Args:
        wheel: a ``transformer_engine-*.whl`` to read the reference from; ``None`` uses the installed
            ``transformer_engine`` distribution.
    Raises:
        FileNotFoundError: the wheel does not exist, or no Transformer Engine is installed (the message
            says how to get the 1.2 MB wheel).
        ValueError: the file is not a wheel holding TE's reference quantiser.
    """

    def __init__(self, wheel: Path | str | None = None):
        sources, self.version, self.origin = _sources(Path(wheel) if wheel is not None else None)
        self._module = _load(sources)

    def quantize(self, x: torch.Tensor, *, scale: str, four_over_six: str | None) -> TEQuantized:
        """Quantise ``x [M, K]`` (float32/bfloat16/float16, ``K % 16 == 0``) with TE's reference.

        ``scale`` is ``"per_tensor"`` or ``"per_token"`` (TE's ``row_scaled_nvfp4``); ``four_over_six`` is
        ``None``, ``"mse"`` or ``"mae"`` (TE's ``nvfp4_use_4over6`` with ``nvfp4_e4m3_max=256``). TE's other
        knobs are Nibble's: 1×16 row blocks, no random Hadamard transform, E4M3 (not power-of-2) scales,
        exact (not fast-math) 4/6 error.
        """
        if x.dim() != 2 or x.shape[-1] % NVFP4_BLOCK:
            raise ValueError(f"TE comparison takes a 2-D tensor [M, K] with K % 16 == 0, got {tuple(x.shape)}")
        ref = self._module
        quantizer = ref.NVFP4QuantizerRef(
            dtype=ref.reference_utils.Fp4Formats.E2M1,
            rowwise=True,
            columnwise=False,
            quant_tile_shape=(1, NVFP4_BLOCK),
            pow_2_scales=False,
            with_rht=False,
            row_scaled_nvfp4=scale == "per_token",
            nvfp4_use_4over6=four_over_six is not None,
            nvfp4_e4m3_max=256 if four_over_six else 448,
            nvfp4_4over6_err_mode=four_over_six or "MAE",
            nvfp4_4over6_err_use_fast_math=False,
        )
        with _Observer() as seen:
            result = quantizer.quantize(x)
        scale_bytes = result.scale.contiguous().view(torch.uint8)
        if four_over_six:
            if len(seen.e4m3_casts) != 2:
                raise RuntimeError(
                    f"TE {self.version}: 2 E4M3 casts expected in its 4/6 path, saw {len(seen.e4m3_casts)}"
                )
            map4, map6 = (c.reshape(scale_bytes.shape).view(torch.uint8) for c in seen.e4m3_casts)
            map_to_4 = (scale_bytes == map4) & (map4 != map6)
        else:
            map_to_4 = torch.zeros(scale_bytes.shape, dtype=torch.bool, device=x.device)
        if seen.decode_scale is None:
            raise RuntimeError(f"TE {self.version}: its global decode scale 1/S was not seen")
        g = seen.decode_scale.reshape(-1) if scale == "per_token" else seen.decode_scale.reshape(())
        return TEQuantized(unpack_e2m1(result.data), scale_bytes, g.to(torch.float32), map_to_4)


class _Observer(TorchFunctionMode):
    """Records TE's first ``torch.div(1.0, S)`` (its global decode scale) and its E4M3 casts."""

    def __init__(self):
        super().__init__()
        self.decode_scale: torch.Tensor | None = None
        self.e4m3_casts: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.div and self.decode_scale is None and args and isinstance(args[0], float):
            self.decode_scale = out.detach().clone()
        if func is torch.Tensor.to and isinstance(out, torch.Tensor) and out.dtype == torch.float8_e4m3fn:
            self.e4m3_casts.append(out.detach().clone())
        return out


def _sources(wheel: Path | None) -> tuple[dict[str, str], str, str]:
    """(module name -> source text, TE version, where it came from) for TE's two reference files."""
    if wheel is not None:
        if not wheel.is_file():
            raise FileNotFoundError(f"Transformer Engine wheel {wheel} does not exist")
        try:
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                missing = [f for f in _FILES if f"{_PACKAGE}/{f}.py" not in names]
                if missing:
                    raise ValueError(f"{wheel} holds no {_PACKAGE}/{missing[0]}.py: not a Transformer Engine wheel")
                sources = {f: zf.read(f"{_PACKAGE}/{f}.py").decode() for f in _FILES}
        except zipfile.BadZipFile as err:
            raise ValueError(f"{wheel} is not a wheel (zip) file: {err}") from None
        version = wheel.name.split("-")[1] if wheel.name.count("-") >= 2 else "unknown"
        return sources, version, str(wheel)
    try:
        dist = importlib.metadata.distribution("transformer_engine")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "Transformer Engine is not installed: `pip install --no-deps transformer-engine==" + TE_VERSION + "` "
            "(a 1.2 MB wheel; its reference quantiser needs no GPU), or pass the wheel's path"
        ) from None
    paths = {f: Path(str(dist.locate_file(f"{_PACKAGE}/{f}.py"))) for f in _FILES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"Transformer Engine {dist.version} is installed without {missing[0]}")
    return {f: p.read_text() for f, p in paths.items()}, dist.version, str(paths["reference_nvfp4"].parent)


def _load(sources: dict[str, str]) -> types.ModuleType:
    """Execute TE's reference files with stand-ins for what they import; ``sys.modules`` is restored after."""
    saved = {name: sys.modules.get(name) for name in (*_STUBBED, _REFERENCE_MODULE)}
    try:
        for name in _STUBBED[:3]:
            sys.modules[name] = types.ModuleType(name)
        sys.modules[_STUBBED[3]] = _gemm_stub()
        sys.modules[_STUBBED[5]] = _quantized_tensor_stub()
        utils = _exec("transformer_engine.pytorch.custom_recipes.reference_utils", sources["reference_utils"])
        sys.modules[_STUBBED[4]] = utils
        sys.modules[_STUBBED[2]].reference_utils = utils
        sys.modules[_STUBBED[2]].gemm = sys.modules[_STUBBED[3]]
        return _exec(_REFERENCE_MODULE, sources["reference_nvfp4"])
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _exec(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module  # dataclasses resolve their module through sys.modules while executing
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _gemm_stub() -> types.ModuleType:
    """The GEMM types TE's reference names in signatures (its GEMM itself is not used)."""
    gemm = types.ModuleType("transformer_engine.pytorch.custom_recipes.gemm")
    gemm.GEMMType = enum.Enum("GEMMType", {"FPROP": "fprop", "DGRAD": "dgrad", "WGRAD": "wgrad"})
    gemm.MMParams = dataclasses.make_dataclass("MMParams", [("out_dtype", object, None)], frozen=True)
    return gemm


def _quantized_tensor_stub() -> types.ModuleType:
    """Base classes of TE's quantiser and storage; only the usage flags matter to quantisation."""
    module = types.ModuleType("transformer_engine.pytorch.quantized_tensor")

    class Quantizer:
        def __init__(self, *, rowwise: bool = True, columnwise: bool = True):
            self.rowwise_usage = rowwise
            self.columnwise_usage = columnwise

    class QuantizedTensorStorage:
        pass

    module.Quantizer = Quantizer
    module.QuantizedTensorStorage = QuantizedTensorStorage
    return module
