"""The torch modules the ChatTTS export traces: the GPT step, Vocos up to its spectrum, and
the streaming steps of the decoder and Vocos, restated on the checkpoint's own tensors and
modules (export.py says why each is restated and what its graph takes and returns; the parity
tests run these modules against the originals).

torch is imported inside each factory, so importing this module costs nothing without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tts_bridge.engines.base import EngineError

if TYPE_CHECKING:
    import torch

EXAMPLE_FRAMES = 7
"""Frames in a streaming step's tracing example: above 1, or the exporter would specialise the
graph to it (0 and 1 are special-cased by torch.export)."""


def _build_gpt_step_class() -> type[Any]:
    import torch

    class _RMSNorm(torch.nn.Module):
        def __init__(self, weight: torch.Tensor, eps: float) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(weight.float().clone(), requires_grad=False)
            self.eps = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            variance = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + self.eps))

    class _Layer(torch.nn.Module):
        """One decoder layer's weights (LlamaDecoderLayer's names, shortened)."""

        def __init__(
            self,
            prefix: str,
            state: Mapping[str, torch.Tensor],
            linear: Callable[[str], torch.nn.Linear],
            eps: float,
        ) -> None:
            super().__init__()
            attn, mlp = prefix + "self_attn.", prefix + "mlp."
            self.input_norm = _RMSNorm(state[prefix + "input_layernorm.weight"], eps)
            # Separate q/k/v (and gate/up) matrices: one fused matrix each was faster at batch 4
            # but slower at batch 1, the case a live request waits for.
            self.q = linear(attn + "q_proj.weight")
            self.k = linear(attn + "k_proj.weight")
            self.v = linear(attn + "v_proj.weight")
            self.o = linear(attn + "o_proj.weight")
            self.post_norm = _RMSNorm(state[prefix + "post_attention_layernorm.weight"], eps)
            self.gate = linear(mlp + "gate_proj.weight")
            self.up = linear(mlp + "up_proj.weight")
            self.down = linear(mlp + "down_proj.weight")

    class _GptStep(torch.nn.Module):
        """LlamaModel's forward for one step with an explicit cache, plus ChatTTS's code heads."""

        def __init__(
            self, state: Mapping[str, torch.Tensor], config: Mapping[str, Any], head_code: Any
        ) -> None:
            super().__init__()
            self.hidden = int(config["hidden_size"])
            self.num_layers = int(config["num_hidden_layers"])
            self.num_heads = int(config["num_attention_heads"])
            self.num_kv_heads = int(config.get("num_key_value_heads") or self.num_heads)
            self.head_dim = int(config.get("head_dim") or self.hidden // self.num_heads)
            eps = float(config.get("rms_norm_eps", 1e-6))
            rope = config.get("rope_parameters") or {}
            theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
            if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
                raise EngineError("only Llama's default rotary embedding is supported")
            if self.num_kv_heads != self.num_heads:
                raise EngineError("grouped-query attention is not supported (ChatTTS has none)")

            def linear(name: str) -> torch.nn.Linear:
                weight = state[name].float()
                layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
                layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
                return layer

            self.layers: list[_Layer] = torch.nn.ModuleList(  # type: ignore[assignment]
                _Layer(f"layers.{i}.", state, linear, eps) for i in range(self.num_layers)
            )
            self.norm = _RMSNorm(state["norm.weight"], eps)
            # transformers computes the inverse frequencies exactly like this (float32 powers).
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim
            self.inv_freq: torch.Tensor
            self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)
            half = self.head_dim // 2
            rotation = torch.zeros(self.head_dim, self.head_dim)
            rotation[torch.arange(half) + half, torch.arange(half)] = -1.0
            rotation[torch.arange(half), torch.arange(half) + half] = 1.0
            self.rotate_half: torch.Tensor
            self.register_buffer("rotate_half", rotation, persistent=False)
            # (num_vq * codes, hidden): one matmul for all four heads.
            num_vq, codes, hidden = head_code.shape
            self.num_vq, self.num_codes = int(num_vq), int(codes)
            self.head_code = torch.nn.Parameter(
                head_code.reshape(num_vq * codes, hidden).float().clone(), requires_grad=False
            )

        def forward(
            self,
            inputs_embeds: torch.Tensor,
            attention_mask: torch.Tensor,
            position_ids: torch.Tensor,
            *cache: torch.Tensor,
        ) -> tuple[torch.Tensor, ...]:
            batch, seq = inputs_embeds.shape[0], inputs_embeds.shape[1]
            total = attention_mask.shape[1]
            past_len = total - seq
            # Additive mask: key j is visible to query i (absolute position past_len + i) when
            # j <= past_len + i and j is not padding. A float32 minimum rather than -inf keeps
            # fully masked rows (left padding during prefill) finite instead of NaN.
            key_pos = torch.arange(total, device=inputs_embeds.device)
            query_pos = torch.arange(seq, device=inputs_embeds.device) + past_len
            causal = key_pos[None, :] <= query_pos[:, None]
            allowed = causal[None, None, :, :] & (attention_mask[:, None, None, :] > 0)
            neg = torch.finfo(torch.float32).min
            mask = torch.where(allowed, 0.0, neg).to(torch.float32)

            freqs = position_ids[..., None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos()[:, None, :, :]
            sin = emb.sin()[:, None, :, :]
            scale = self.head_dim**-0.5

            def heads(x: torch.Tensor) -> torch.Tensor:
                return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

            def rotate(x: torch.Tensor) -> torch.Tensor:
                # rotate_half as a product with a signed permutation: exact (every output is one
                # input times +-1) and 4 graph nodes instead of 7, per layer for q and k.
                return x * cos + torch.matmul(x, self.rotate_half) * sin

            x = inputs_embeds
            presents: list[torch.Tensor] = []
            for i, layer in enumerate(self.layers):
                past_k, past_v = cache[4 * i], cache[4 * i + 1]
                recent_k, recent_v = cache[4 * i + 2], cache[4 * i + 3]
                h = layer.input_norm(x)
                q = rotate(heads(layer.q(h)))
                # Only the short recent part is concatenated (and copied) each step; the long
                # settled part is read where it lies (see the module docs).
                k = torch.cat((recent_k, rotate(heads(layer.k(h)))), dim=2)
                v = torch.cat((recent_v, heads(layer.v(h))), dim=2)
                presents += [k, v]
                settled = past_k.shape[2]
                scores = torch.cat(
                    (torch.matmul(q, past_k.transpose(2, 3)), torch.matmul(q, k.transpose(2, 3))),
                    dim=3,
                )
                weights = torch.softmax(scores * scale + mask, dim=-1)
                attn = torch.matmul(weights[..., :settled], past_v) + torch.matmul(
                    weights[..., settled:], v
                )
                attn = attn.transpose(1, 2).reshape(batch, seq, self.hidden)
                x = x + layer.o(attn)
                h = layer.post_norm(x)
                x = x + layer.down(torch.nn.functional.silu(layer.gate(h)) * layer.up(h))
            last = self.norm(x)[:, -1, :]
            logits = torch.matmul(last, self.head_code.t()).view(batch, self.num_vq, -1)
            return (logits, last, *presents)

    return _GptStep


def GptStep(  # noqa: N802 -- a factory standing in for a class defined after torch is imported
    state: Mapping[str, torch.Tensor], config: Mapping[str, Any], head_code: torch.Tensor
) -> Any:
    """The exported GPT step as a torch module (also what the parity tests run)."""
    return _build_gpt_step_class()(state, config, head_code)


def VocosSpectrum(vocos: Any) -> Any:  # noqa: N802 -- a factory, like GptStep
    """Vocos's backbone and ISTFT head up to (magnitude, phase); the ISTFT is left out."""
    import torch

    class _Spectrum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = vocos.backbone
            self.out = vocos.head.out

        def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # The first lines of vocos.heads.ISTFTHead.forward, verbatim in effect.
            x = self.out(self.backbone(mel)).transpose(1, 2)
            mag, phase = x.chunk(2, dim=1)
            mag = torch.clip(torch.exp(mag), max=1e2)
            return mag, phase

    return _Spectrum().eval()


# -- streaming step graphs ----------------------------------------------------------------------


def _conv_pad(conv: Any) -> int:
    """A convolution's padding p, which must be its "same" padding dilation x (kernel // 2)."""
    pad = int(conv.dilation[0]) * (int(conv.kernel_size[0]) // 2)
    if int(conv.padding[0]) != pad or int(conv.stride[0]) != 1:
        raise EngineError(f"{conv}: not a stride-1 convolution with 'same' zero padding")
    return pad


def _build_stream_base() -> type[Any]:
    import torch
    from torch.nn import functional

    class _StreamStack(torch.nn.Module):
        """Shared steps of the streaming graphs (see the module docs); ``pads`` lists each cached
        convolution's p in the order of the graph's caches."""

        pads: list[int]

        def conv(
            self, conv: Any, x: torch.Tensor, cache: torch.Tensor, flush: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """(output, the buffer it read, the next cache) of one cached convolution."""
            pad = _conv_pad(conv)
            joined = torch.cat([cache, x], dim=2)
            # (1, F) -> (1, channels, F x p) zeros: the right padding when F is 1.
            right = (flush[:, None, :] * 0.0).repeat(1, int(conv.in_channels), pad)
            buffer = torch.cat([joined, right], dim=2)
            out = functional.conv1d(
                buffer,
                conv.weight,
                conv.bias,
                stride=1,
                padding=0,
                dilation=conv.dilation,
                groups=conv.groups,
            )
            return out, buffer, joined[:, :, -2 * pad :]

        def block(
            self, block: Any, x: torch.Tensor, cache: torch.Tensor, flush: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """A ConvNeXt block (ChatTTS's or Vocos's, no conditioning) and its next cache."""
            pad = _conv_pad(block.dwconv)
            y, buffer, new_cache = self.conv(block.dwconv, x, cache, flush)
            # Output frame t adds input frame t, which sits p frames into the buffer.
            residual = buffer[:, :, pad:-pad]
            h = block.pwconv2(block.act(block.pwconv1(block.norm(y.transpose(1, 2)))))
            scale = getattr(block, "gamma", None)
            if scale is None:
                scale = getattr(block, "weight", None)
            if scale is not None:
                h = scale * h
            return residual + h.transpose(1, 2), new_cache

    return _StreamStack


def DecoderStream(dvae: Any) -> Any:  # noqa: N802 -- a factory, like GptStep
    """ChatTTS's DVAE decode path (as ``decoder.onnx``) as a streaming step:
    (hidden (1, H, new codes), flush, *caches) -> (mel (1, mels, frames), *next caches)."""
    import torch

    base = _build_stream_base()
    inner = dvae.decoder
    if int(inner.conv_out.kernel_size[0]) != 1:
        raise EngineError("the DVAE decoder's conv_out is expected to be pointwise")

    class _DecoderStream(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.dvae = dvae
            self.half = int(inner.conv_in[0].in_channels)
            convs = [inner.conv_in[0], inner.conv_in[2]]
            convs += [b.dwconv for b in inner.decoder_block] + [dvae.out_conv]
            self.pads = [_conv_pad(c) for c in convs]
            self.channels = [int(c.in_channels) for c in convs]

        def forward(self, hidden: torch.Tensor, flush: torch.Tensor, *caches: torch.Tensor) -> Any:
            # decoder.onnx's view(b, 2, c/2, t).permute(0, 2, 3, 1) without a reshape to t: the
            # flush may bring no new codes, and ONNX's Reshape reads a 0 in a shape as "keep".
            half = self.half
            x = torch.stack([hidden[:, :half], hidden[:, half:]], dim=3).flatten(2)
            out: list[torch.Tensor] = []
            x, _, cache = self.conv(inner.conv_in[0], x, caches[0], flush)
            out.append(cache)
            x = inner.conv_in[1](x)
            x, _, cache = self.conv(inner.conv_in[2], x, caches[1], flush)
            out.append(cache)
            for index, block in enumerate(inner.decoder_block):
                x, cache = self.block(block, x, caches[2 + index], flush)
                out.append(cache)
            x = inner.conv_out(x)
            x, _, cache = self.conv(dvae.out_conv, x, caches[-1], flush)
            out.append(cache)
            return (x * dvae.coef, *out)

    module = _DecoderStream().eval()
    module.example = torch.randn(1, dvae.decoder.conv_in[0].in_channels * 2, EXAMPLE_FRAMES)
    module.data_names = (["hidden"], ["mel"])
    return module


def VocosStream(vocos: Any) -> Any:  # noqa: N802 -- a factory, like GptStep
    """``VocosSpectrum`` as a streaming step: (mel (1, mels, new frames), flush, *caches) ->
    (magnitude, phase (1, n_fft/2 + 1, frames), *next caches)."""
    import torch

    base = _build_stream_base()
    backbone = vocos.backbone
    if getattr(backbone, "adanorm", False):
        raise EngineError("Vocos with AdaLayerNorm conditioning cannot be streamed")

    class _VocosStream(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.backbone = backbone
            self.out = vocos.head.out
            convs = [backbone.embed] + [b.dwconv for b in backbone.convnext]
            self.pads = [_conv_pad(c) for c in convs]
            self.channels = [int(c.in_channels) for c in convs]

        def forward(self, mel: torch.Tensor, flush: torch.Tensor, *caches: torch.Tensor) -> Any:
            out: list[torch.Tensor] = []
            x, _, cache = self.conv(backbone.embed, mel, caches[0], flush)
            out.append(cache)
            x = backbone.norm(x.transpose(1, 2)).transpose(1, 2)
            for index, block in enumerate(backbone.convnext):
                x, cache = self.block(block, x, caches[1 + index], flush)
                out.append(cache)
            x = self.out(backbone.final_layer_norm(x.transpose(1, 2))).transpose(1, 2)
            mag, phase = x.chunk(2, dim=1)
            mag = torch.clip(torch.exp(mag), max=1e2)
            return (mag, phase, *out)

    module = _VocosStream().eval()
    module.example = torch.randn(1, int(backbone.input_channels), EXAMPLE_FRAMES)
    module.data_names = (["mel"], ["magnitude", "phase"])
    return module
