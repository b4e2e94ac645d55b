"""GPU compute measurements: bf16 GEMMs, SDPA attention, one whole Llama layer, GPU casts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .records import Table
from .timing import gpu_times_s


def gemm_shapes(quick: bool) -> Iterator[tuple[str, int, int, int]]:
    """(name, m, n, k) of the GEMMs of one Llama layer: tokens m times weight (k in, n out).

    Why these names only for logging: the table keys on (m, n, k); the simulator asks by shape.
    """
    from .llama import default_kv_heads, swiglu_ffn

    tokens = (2048, 8192, 16384) if quick else (2048, 4096, 8192, 16384)
    for hidden in (2048, 4096, 8192):
        ffn = swiglu_ffn(hidden)
        kv_dim = default_kv_heads(hidden // 128) * 128
        for m in tokens:
            yield "qkv", m, hidden + 2 * kv_dim, hidden
            yield "out_proj", m, hidden, hidden
            yield "mlp_up", m, ffn, hidden
            yield "mlp_down", m, hidden, ffn


def bench_gemm(torch: Any, table: Table, quick: bool) -> None:
    for _name, m, n, k in gemm_shapes(quick):
        times_s = _time_gemm(torch, m, n, k, repeats=15 if quick else 30)
        table.add("gemm", "fwd", "bf16", times_s, m=m, n=n, k=k)


def _time_gemm(torch: Any, m: int, n: int, k: int, repeats: int) -> list[float]:
    device = torch.device("cuda")
    # Why several input sets: small operands fit in the 60 MB L2 and would time the cache, not HBM.
    sets = [
        (
            torch.randn(m, k, device=device, dtype=torch.bfloat16),
            torch.randn(k, n, device=device, dtype=torch.bfloat16),
        )
        for _ in range(2 if m * k * 2 > 64 << 20 else 4)
    ]
    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    counter = iter(range(10**9))

    def run() -> None:
        a, b = sets[next(counter) % len(sets)]
        torch.matmul(a, b, out=out)

    return gpu_times_s(torch, run, warmup=5, repeats=repeats)


def bench_attention(torch: Any, table: Table, quick: bool) -> None:
    head_dim = 128
    batches = (1, 4) if quick else (1, 2, 4)
    for seq in (1024, 2048, 4096, 8192):
        for heads in (16, 32):
            for batch in batches:
                dims = {"batch": batch, "seq": seq, "heads": heads, "kv_heads": heads, "head_dim": head_dim}
                fwd_s, fwd_bwd_s = _time_attention(torch, batch, seq, heads, head_dim, 10 if quick else 20)
                table.add("attention", "fwd", "bf16", fwd_s, **dims)
                table.add("attention", "fwd_bwd", "bf16", fwd_bwd_s, **dims)


def _time_attention(
    torch: Any, batch: int, seq: int, heads: int, head_dim: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Causal SDPA (flash on Hopper) forward alone and forward+backward."""
    functional = torch.nn.functional
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def fwd() -> None:
        with torch.no_grad():
            functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd() -> None:
        out = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), grad_out)

    return gpu_times_s(torch, fwd, 3, repeats), gpu_times_s(torch, fwd_bwd, 3, repeats)


def bench_layer(torch: Any, table: Table, quick: bool) -> None:
    """One Llama decoder layer, forward and forward+backward (no recompute), bf16 weights and activations."""
    from .llama import DecoderLayer, default_kv_heads, init_weights_, swiglu_ffn

    for hidden in (2048, 4096):
        heads = hidden // 128
        kv_heads = default_kv_heads(heads)
        ffn = swiglu_ffn(hidden)
        layer = DecoderLayer(hidden, heads, kv_heads, ffn).to(device="cuda", dtype=torch.bfloat16)
        init_weights_(layer)
        for seq in (2048, 4096):
            for batch in (1, 4) if quick else (1, 2, 4):
                fwd_s, fwd_bwd_s = _time_layer(torch, layer, batch, seq, hidden, 10 if quick else 20)
                dims = {
                    "batch": batch,
                    "seq": seq,
                    "heads": heads,
                    "kv_heads": kv_heads,
                    "head_dim": 128,
                    "hidden": hidden,
                    "ffn": ffn,
                }
                table.add("layer", "fwd", "bf16", fwd_s, **dims)
                table.add("layer", "fwd_bwd", "bf16", fwd_bwd_s, **dims)


def _time_layer(
    torch: Any, layer: Any, batch: int, seq: int, hidden: int, repeats: int
) -> tuple[list[float], list[float]]:
    from .llama import rotary_tables

    cos, sin = rotary_tables(seq, 128, torch.device("cuda"), torch.bfloat16)
    x = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_out = torch.randn_like(x)
    params = [x, *layer.parameters()]

    def fwd() -> None:
        with torch.no_grad():
            layer(x, cos, sin)

    def fwd_bwd() -> None:
        # autograd.grad, not backward(): nothing accumulates into .grad between repeats.
        torch.autograd.grad(layer(x, cos, sin), params, grad_out)

    return gpu_times_s(torch, fwd, 3, repeats), gpu_times_s(torch, fwd_bwd, 3, repeats)


def bench_gpu_cast(torch: Any, table: Table, quick: bool) -> None:
    counts = (10**6, 10**7, 10**8) if quick else (10**6, 10**7, 10**8, 10**9)
    for elements in counts:
        to_bf16_s, to_fp32_s = _time_gpu_cast(torch, elements)
        # bytes = what the cast reads plus writes (4 + 2 per element), to compare with HBM bandwidth.
        table.add("cast", "gpu_fp32_to_bf16", "fp32", to_bf16_s, elements=elements, bytes=elements * 6)
        table.add("cast", "gpu_bf16_to_fp32", "bf16", to_fp32_s, elements=elements, bytes=elements * 6)


def _time_gpu_cast(torch: Any, elements: int) -> tuple[list[float], list[float]]:
    fp32 = torch.randn(elements, device="cuda", dtype=torch.float32)
    bf16 = torch.empty(elements, device="cuda", dtype=torch.bfloat16)
    to_bf16_s = gpu_times_s(torch, lambda: bf16.copy_(fp32), 3, 20)
    to_fp32_s = gpu_times_s(torch, lambda: fp32.copy_(bf16), 3, 20)
    return to_bf16_s, to_fp32_s
